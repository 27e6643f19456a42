"""Exit codes a task reserves, shared by the task runtime and the lifecycle policy.

A module of its own so that importing the policy (and with it the package)
never imports :mod:`tfk8s_magics.runtime.task`: tasks start as
``python -m tfk8s_magics.runtime.task``, and runpy warns on stderr — the first
line of every task's log — when that module is already imported.
"""

#: The script cannot run at all (syntax error, missing module): do not restart it.
EXIT_SCRIPT_BROKEN = 3
#: The script lost a peer (TensorFlow's Unavailable/Aborted/Cancelled in a collective or a
#: PS call): a consequence of another task's end, retried (EX_TEMPFAIL).
EXIT_PEER_LOST = 75
