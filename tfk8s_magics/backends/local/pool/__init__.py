"""The warm pool: task processes that have already imported TensorFlow, waiting for a task.

A cold task spends almost all of its start importing TensorFlow (3–5 s on
two cores).  The pool keeps ``pool_size`` (``$TFK8S_POOL_SIZE``) whole
processes that did that ahead of time; a launch hands each one its task and
it starts at once, and the pool starts replacements in the background.

Who owns what:

* the **pool daemon** (``python -m tfk8s_magics.backends.local.pool daemon``)
  belongs to this user: one per task environment (:func:`pool_key`), so every
  kernel of a lab user shares one.  Each process that launches (a notebook
  kernel, or any other owner) joins it (:func:`ensure`: the first one starts
  it); it holds a pidfd of each owner and ends with the last one.  It listens
  on a unix socket in a 0700 directory of this user (and checks the peer's
  uid), is no owner's child (it forks once more at start), and is the
  *parent* of every pooled process, so it reaps them and knows their true exit
  status.  It keeps ``pool_size`` processes and ends them after ``pool_idle``
  seconds unused; the next launch refills it.
* a **pooled process** (``... pool worker FD``) is started with exactly
  the environment a task of a default launch gets (:func:`base_env`,
  loopback shim included), in its own session (process group), with a
  parent-death signal on the daemon.  It imports what a task imports before
  user code (TensorFlow, through the same quiet import, and the task
  runtime), says ``idle`` and waits for one assignment: the task's
  environment, working folder, log file and ready pipe.  It then runs
  :func:`tfk8s_magics.runtime.task.main` exactly as a cold task does and
  exits: it never runs two tasks.  No fork happens after TensorFlow is
  imported.
* the cluster's **supervisor** claims processes (:func:`claim`) for the
  tasks it starts.  It sends the log file, the ready pipe and a *status
  pipe* (SCM_RIGHTS); the daemon writes the task's wait status into the
  status pipe when it reaps it, so the supervisor sees the same exit code or
  signal as for a child of its own (:class:`PooledProcess`).  The daemon
  watches the claiming supervisor with a pidfd and kills the task's process
  group when it dies, as the parent-death signal does for a cold task.

A task runs cold when its import-time environment differs from the pool's
(:func:`mismatch`): TensorFlow and Keras read variables such as
``TF_CPP_MIN_LOG_LEVEL``, ``TF_USE_LEGACY_KERAS`` or ``OMP_NUM_THREADS``
once, at import, so a pooled process could not honour a different value.
Detached clusters always run cold (the pool dies with its owner).  The loopback
shim is the one exception to "same value or cold": tasks behind it (in-graph
clusters) need it preloaded at exec, tasks in a private network namespace have
none, so a pooled process preloads it and a namespaced task switches it off
(every ``bind()`` passes through; :func:`shim_off`): one pool serves both.

**Namespaces** (issue 16: a pooled task trains as fast as a cold one).  A
process that imports TensorFlow on the host and joins a cluster's private
network namespace afterwards keeps the threads the import made in the host's
namespace (and another user's multithreaded process cannot join a user
namespace at all).  So a pooled process never changes namespace after its
import: the pool keeps a **spare namespace** (:func:`~tfk8s_magics.isolation.netns.make_namespace`,
held by descriptors, no process) and starts its processes for namespaced
clusters *inside* it, before they import anything.  A namespaced launch's
supervisor **adopts** the spare (:func:`adopt`: it enters that namespace
instead of making a new one, and claims the processes in it; tasks beyond
them start cold, inside it too); the namespace is then that cluster's alone,
its unclaimed processes are ended (:func:`release`), and the pool makes a
fresh spare for its refill.  Processes for in-graph and ``loopback``
clusters stay in the host's namespace.  Which kind the pool keeps follows its
launches: the kind the owner names at start (``ensure(kind)``), then the kind
of the last launch that asked (a claim on the host, or an adoption), one
replacement at a time.  Refills (everything after the first fill) import at
low CPU priority (autogroup nice :data:`REFILL_NICE`; the process sets 0 again
before it runs its task), so they do not slow the clusters that are running.

The package, one file per job: :mod:`.protocol` (the messages, documented in
one place, and where pools live), :mod:`.compat` (which tasks a pooled process
can run), :mod:`.owner` (a kernel's side: join, size, leave, show),
:mod:`.claims` (a supervisor's side: claim, adopt, release), :mod:`.daemon`
(the pool daemon), :mod:`.worker` (a pooled process) and :mod:`.priority` (the
refills' CPU priority).  Their public names are re-exported here.
"""

from __future__ import annotations

from .claims import INTERRUPTED, PooledProcess, adopt, available, claim, release
from .compat import IMPORT_TIME, LATE, base_env, mismatch, pool_shim, shim_off
from .daemon import Daemon, memory
from .owner import (
    configure,
    current,
    daemon_pid,
    default_kind,
    describe,
    ensure,
    memory_line,
    pool_idle,
    pool_size,
    pools,
    resize,
    shutdown,
    status_text,
)
from .priority import REFILL_NICE, autogroup_nice
from .protocol import (
    ANY,
    CLAIM_TIMEOUT,
    HOST,
    MAX_MESSAGE,
    NS,
    REQUEST_TIMEOUT,
    Interrupted,
    info,
    pool_key,
    runtime_dir,
    socket_path,
)

__all__ = [
    "ANY", "CLAIM_TIMEOUT", "HOST", "IMPORT_TIME", "INTERRUPTED", "LATE", "MAX_MESSAGE", "NS",
    "REFILL_NICE", "REQUEST_TIMEOUT", "Daemon", "Interrupted", "PooledProcess", "adopt",
    "autogroup_nice", "available", "base_env", "claim", "configure", "current", "daemon_pid",
    "default_kind", "describe", "ensure", "info", "memory", "memory_line", "mismatch", "pool_idle",
    "pool_key", "pool_shim", "pool_size", "pools", "release", "resize", "runtime_dir", "shim_off",
    "shutdown", "socket_path", "status_text",
]
