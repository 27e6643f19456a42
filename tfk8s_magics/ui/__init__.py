"""What the notebook shows: status tables, live log views, dashboards, TensorBoard.

Modules: :mod:`.render` (pure HTML/text of every part, shared by all views
and the fallbacks), :mod:`.dashboard` (one cluster, live), :mod:`.actions`
(the Stop/Delete bar of the dashboard and the list), :mod:`.logtabs` (a
dashboard's per-task logs), :mod:`.cluster_list` (every cluster, live),
:mod:`.logview` (the log under a launch cell), :mod:`.live` (the render
thread, the end-state enum :class:`~.live.ViewEnd`, cell bookkeeping),
:mod:`.plot` (metric curves), :mod:`.tensorboard`, :mod:`.summary` (the launch
cell's static record of how a cluster ended, kept by a saved notebook).

Everything built from names, log lines or error messages is escaped: it
is shown as text, never interpreted as HTML.

The threading rule
------------------
Four kinds of thread meet in a view:

* **feed threads** (:class:`~tfk8s_magics.watch.ClusterFeed`) call a view's
  ``_on_status``/``_on_logs``.  These only record what arrived (one
  assignment, or under the view's ``_lock``) and poke the view's
  :class:`~.live.Throttle`; they never touch a widget and never call the
  backend;
* the view's **render thread** (its Throttle) is the one that draws;
* **button handlers** run on the kernel's main thread; they change state
  under a lock and start an action thread for anything that changes the
  cluster;
* **action threads** (:class:`~.actions.ActionBar`, "Full log") call the
  backend, then draw their outcome.

So that these never corrupt a widget nor stall one another:

1. A widget is changed only under its view's ``_draw_lock`` (an RLock), by
   whichever of the threads above changes it.
2. No I/O under a lock another thread waits on: the backend is called
   with no lock held (the feed registry's lock included); a lock guards
   memory only, for as long as it takes to copy or assign.
3. A shared collection is copied under the lock that guards it before it
   is iterated (``list(...)``/``dict(...)`` inside ``with lock:``).
4. An object's private state is changed only by its own methods: another
   object calls a public method (``feed.subscribe``, ``bar.draw``) or a
   callback it was given.
5. A view's life is one :class:`~.live.ViewEnd` value, and its ``finished``
   event is set once the final state is drawn; its threads end then.
"""

#: Internal: nothing here is public API (the public API is ``tfk8s_magics.__all__``).
__all__: list[str] = []
