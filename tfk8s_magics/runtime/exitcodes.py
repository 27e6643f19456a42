"""Exit codes a task reserves, shared by the task runtime and the lifecycle policy.

A module of its own so that importing the policy (and with it the package)
never imports :mod:`tfk8s_magics.runtime.task`: tasks start as
``python -m tfk8s_magics.runtime.task``, and runpy warns on stderr — the first
line of every task's log — when that module is already imported.
"""

#: The script cannot run at all (syntax error, missing module): do not restart it.  A script's
#: own ``sys.exit(3)`` exits 3 too, so the code alone does not say "broken": the runtime also
#: writes :data:`BROKEN_MARK` to its termination file (below), and only that makes it "broken".
EXIT_SCRIPT_BROKEN = 3
#: The first word of the termination message of a task whose script cannot run.
BROKEN_MARK = "ScriptBroken"
#: The first word of the termination message of a task whose own port was taken by another
#: process before its server could listen (local backend, tasks on the host's loopback): the
#: supervisor moves it to a new port and restarts the cluster's tasks with the new addresses.
PORT_TAKEN_MARK = "PortTaken"

#: Where the runtime writes its termination message: the local supervisor names a file in the
#: cluster dir; on Kubernetes the runtime uses the container's ``/dev/termination-log`` (the
#: default ``terminationMessagePath``: the kubelet puts it in the terminated state's ``message``).
TERMINATION_FILE_ENV = "TFK8S_TERMINATION_FILE"
KUBERNETES_TERMINATION_LOG = "/dev/termination-log"
#: The script lost a peer (TensorFlow's Unavailable/Aborted/Cancelled in a collective or a
#: PS call): a consequence of another task's end, retried (EX_TEMPFAIL).
EXIT_PEER_LOST = 75
