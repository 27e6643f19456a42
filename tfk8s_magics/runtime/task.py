"""Entry point of every task, local process or pod: ``python -m tfk8s_magics.runtime.task``.

It reads its role from ``TF_CONFIG`` and either

* runs the training script named by ``TFK8S_SCRIPT`` (between-graph workers,
  chief, evaluator), or
* starts a ``tf.distribute.Server`` and serves until stopped (parameter
  servers, and every task of an in-graph cluster).

Readiness is signalled precisely, never guessed: a server is ready once
``Server(start=True)`` returned (its port is bound); a script task once
TensorFlow is imported and the script is about to run.  The signal is a
line on the file descriptor ``TFK8S_READY_FD`` (local backend) and/or a file
at ``TFK8S_READY_FILE`` (a Kubernetes exec probe can test it).

Identity: the local backend hands each process its ``TF_CONFIG`` and
``TFK8S_TASK``.  A Kubernetes pod is made from one template per role (a
JobSet's replicated Job), so it derives both itself
(:func:`resolve_identity`): its role from ``TFK8S_ROLE``, its index from
``JOB_COMPLETION_INDEX`` (set by the Job controller of an Indexed Job), the
cluster's addresses from ``TFK8S_CLUSTER_DEF``, and TF_CONFIG from the same
pure :func:`~tfk8s_magics.tfconfig.tf_config` the local backend uses.  A
restarted pod has the same role and index, hence the same identity.

Exit codes: 0 success; 1 the script raised; :data:`EXIT_SCRIPT_BROKEN` the
script could not be compiled or failed on an import, which no restart can
fix (said also by :data:`BROKEN_MARK` in the termination file, since a
script's own ``sys.exit(3)`` is exit 3 too and is not "broken");
:data:`EXIT_PEER_LOST` the script lost a peer (TensorFlow's
Unavailable/Aborted/Cancelled), a consequence of another task's end;
anything else is the script's own ``sys.exit`` code.
"""

from __future__ import annotations

import errno
import json
import os
import runpy
import socket
import sys
import tempfile
import traceback
from collections.abc import MutableMapping

from .. import tfconfig
from ..scriptcheck import COLLECTIVE_WITH_PS
from ..spec import Task
from ..taskenv import import_tensorflow
from . import stopsignal
from .exitcodes import (
    BROKEN_MARK,
    EXIT_PEER_LOST,
    EXIT_SCRIPT_BROKEN,
    KUBERNETES_TERMINATION_LOG,
    PORT_TAKEN_MARK,
    TERMINATION_FILE_ENV,
)
from .leave import leave_together


def task_from_env(environ: MutableMapping[str, str]) -> Task | None:
    """This task's role and index: ``TFK8S_TASK``, else ``TFK8S_ROLE`` + ``JOB_COMPLETION_INDEX``."""
    name = environ.get("TFK8S_TASK")
    if name:
        return Task.parse(name)
    role, index = environ.get("TFK8S_ROLE"), environ.get("JOB_COMPLETION_INDEX", "")
    if role and index.isdigit():
        return Task(role, int(index))
    return None


def resolve_identity(environ: MutableMapping[str, str]) -> None:
    """Set ``TF_CONFIG`` and ``TFK8S_TASK`` in ``environ`` when the pod only knows its role and index.

    Raises ``KeyError`` naming what is missing when neither form is there.
    """
    if "TF_CONFIG" in environ and environ.get("TFK8S_TASK"):
        return
    task = task_from_env(environ)
    if task is None:
        raise KeyError("TF_CONFIG, or TFK8S_ROLE and JOB_COMPLETION_INDEX")
    environ["TFK8S_TASK"] = task.name
    if "TF_CONFIG" not in environ:
        environ["TF_CONFIG"] = tfconfig.tf_config(json.loads(environ["TFK8S_CLUSTER_DEF"]), task)


def signal_ready() -> None:
    """Tell whoever supervises this task that it is ready."""
    fd = os.environ.pop("TFK8S_READY_FD", None)
    if fd:
        try:
            os.write(int(fd), b"ready\n")
            os.close(int(fd))
        except OSError:
            pass  # the supervisor is gone; our parent-death signal will end us
    path = os.environ.get("TFK8S_READY_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))


def run_server(tf_config: dict) -> int:
    """Serve as one task of the cluster until killed."""
    tf = import_tensorflow()

    task, port = tf_config["task"], own_port(tf_config)
    if port_taken(port):
        return port_lost(port)
    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec(tf_config["cluster"]),
            job_name=task["type"],
            task_index=int(task["index"]),
            protocol="grpc",
            start=True,
        )
    except Exception:
        if port_taken(port):  # taken between our check and the bind
            return port_lost(port)
        raise
    print(f"tfk8s: {task['type']}-{task['index']} serving at {server.target}", flush=True)
    signal_ready()
    server.join()  # parameter servers are stopped from outside (grace period + SIGTERM)
    return 0


class StrategyDoesNotFit(RuntimeError):
    """The script built a strategy that would wait forever for this cluster's shape."""


def guard_collective_strategy() -> None:
    """Make MultiWorkerMirroredStrategy fail at once, not hang, when TF_CONFIG names a ``ps`` job.

    The launch refuses such scripts when it can see the strategy in the
    source; this catches the rest (a strategy built in a helper module).
    """
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    if not cluster.get("ps"):
        return
    try:
        from tensorflow.python.distribute import collective_all_reduce_strategy as cars
    except ImportError:
        return
    def refuse(self, *args, **kwargs):
        raise StrategyDoesNotFit(
            COLLECTIVE_WITH_PS.format(name="MultiWorkerMirroredStrategy", ps=len(cluster["ps"]))
        )

    for name in ("CollectiveAllReduceStrategy", "CollectiveAllReduceStrategyV1"):
        cls = getattr(cars, name, None)
        if cls is not None:
            cls.__init__ = refuse


def broken(why: str) -> int:
    """Say that the script cannot run (stderr and the termination file); return the exit code."""
    print(f"tfk8s: {why}", file=sys.stderr, flush=True)
    _terminate_with(f"{BROKEN_MARK}: {why}")
    return EXIT_SCRIPT_BROKEN


def _terminate_with(message: str) -> None:
    """Write the termination message: to the supervisor's file (``$TFK8S_TERMINATION_FILE``,
    created here without following a symlink) or, in a pod, to ``/dev/termination-log`` when it
    exists (never created)."""
    path = os.environ.get(TERMINATION_FILE_ENV)
    flags = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    if path:
        flags |= os.O_CREAT
    else:
        path = KUBERNETES_TERMINATION_LOG
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return  # no termination file: the exit code alone says it
    try:
        os.write(fd, message[:4096].encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)


def own_port(tf_config: dict) -> int | None:
    """This task's port in ``TF_CONFIG`` (None when it names none)."""
    task = tf_config.get("task") or {}
    try:
        address = tf_config["cluster"][task["type"]][int(task["index"])]
        return int(str(address).rsplit(":", 1)[1])
    except (KeyError, IndexError, ValueError, TypeError):
        return None


def port_taken(port: int | None) -> bool:
    """Whether another process listens on ``port`` here, so this task's server cannot (a port
    picked at launch and taken before the task bound it)."""
    if port is None:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            s.bind(("0.0.0.0", port))  # what TensorFlow's server binds (the shim: loopback)
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def port_lost(port: int) -> int:
    """Exit saying our port was taken: the supervisor moves this task to another one."""
    print(f"tfk8s: port {port} was taken by another process before this task could listen on it",
          file=sys.stderr, flush=True)
    _terminate_with(f"{PORT_TAKEN_MARK}: {port}")
    return EXIT_PEER_LOST


def run_script(path: str) -> int:
    """Run the training script as ``__main__``; map its outcome to an exit code."""
    try:
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec")
    except (OSError, SyntaxError, ValueError) as e:
        return broken(f"the training script cannot be compiled: {e}")
    del code
    import_tensorflow()  # before "ready": starting = importing TF
    port = own_port(json.loads(os.environ.get("TF_CONFIG") or "{}"))
    if port_taken(port):  # the strategy's server could not listen: move before running anything
        return port_lost(port)

    guard_collective_strategy()
    stopsignal.install()  # a stop (SIGTERM) ends the script cleanly, even under TensorFlow's notifier
    stopsignal.watch_tensorflow()
    # As `python path/script.py` does: the script's own folder comes first (for a
    # cell body, the kernel's working folder), in place of the folder `-m` put there.
    script_dir = os.environ.get("TFK8S_SCRIPT_DIR") or os.path.dirname(os.path.abspath(path))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    if os.environ.get("TFK8S_FILES_DIR"):  # --file files, beside the script
        sys.path.insert(1, os.environ["TFK8S_FILES_DIR"])
    sys.argv = [path]
    signal_ready()
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except StrategyDoesNotFit as e:
        return broken(str(e))
    except ImportError as e:
        print_user_traceback(e, path)
        if not import_at_top_level(e, path):
            return 1  # a late import (inside a function, mid-training) is the script raising
        return broken("the training script failed on an import; restarting cannot fix it.")
    except BaseException as e:  # noqa: BLE001 - report any failure of user code as exit 1
        print_user_traceback(e, path)
        if stopsignal.requested():  # the stop ended the script, whatever it raised on the way
            return stopsignal.EXIT_STOPPED
        port = own_port(json.loads(os.environ.get("TF_CONFIG") or "{}"))
        if "gRPC server" in str(e) and port_taken(port):  # the strategy could not start our server
            return port_lost(port)
        if _lost_a_peer(e):
            print("tfk8s: the script lost a peer (another task ended); it will be restarted.",
                  file=sys.stderr, flush=True)
            return EXIT_PEER_LOST
        return 1
    return 0


def print_user_traceback(e: BaseException, path: str) -> None:
    """Print ``e``'s traceback from the script's first frame on (this runtime's and runpy's
    frames say nothing about the user's code), then a hint where one helps: a NameError in a
    cell body is most often a notebook variable, which the task's own process does not have."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    if tb is None:  # raised before the script ran a line (or outside it): the whole story
        tb = e.__traceback__
    traceback.print_exception(type(e), e, tb)
    if isinstance(e, NameError) and os.environ.get("TFK8S_SCRIPT_IS_CELL") == "1":
        name = getattr(e, "name", None) or str(e)
        print(f"tfk8s: {name!r} is not defined in this task. The cell body runs as a script in each "
              "task's own process, not in the notebook kernel, so the notebook's variables and imports "
              "are not there: define or import it in the cell, pass a value with --env NAME=VALUE, or "
              "a module with --file.", file=sys.stderr, flush=True)


def import_at_top_level(e: BaseException, path: str) -> bool:
    """Whether ``e`` was raised by the script's module-level code (its imports at the top): the
    script cannot run at all.  An import inside a function, late in training, is an exception like
    any other (exit 1), not "the script cannot run"."""
    frame_name = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            frame_name = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return frame_name in (None, "<module>")


def _lost_a_peer(e: BaseException) -> bool:
    """Whether ``e`` is TensorFlow saying a peer or parameter server went away."""
    import tensorflow as tf

    return isinstance(e, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError))


def log_dir_problem(path: str | None) -> str | None:
    """Why this task cannot write its log directory (checkpoints, TensorBoard, logs), or None.

    On Kubernetes the claim is writable by the task only when its storage applies the pod's
    ``fsGroup``: most CSI drivers do only with ``fsGroupPolicy: File``.  Without it the
    first checkpoint would fail with a traceback deep in TensorFlow; here it is one sentence
    at start, and the task is not restarted (nothing a restart does can fix the storage).
    """
    if not path:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        # a unique name: every task of the cluster (pid 1 in each pod) probes the same claim
        fd, probe = tempfile.mkstemp(prefix=".tfk8s-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return (f"the log directory {path} is not writable by this task (uid {os.getuid()}, "
                f"gid {os.getgid()}, groups {sorted(os.getgroups())}): {e.strerror}. Its storage "
                "must let the pod's fsGroup write (a CSI driver with fsGroupPolicy File, or "
                "files group-writable by that group): ask your administrator "
                "(docs/admins/kubernetes.md, Storage).")
    return None


def main() -> int:
    """Run this task according to its environment."""
    try:
        resolve_identity(os.environ)
    except (KeyError, ValueError) as e:
        return broken(f"this task cannot tell which task it is: set {e} (a broken pod "
                      "template; restarting cannot fix it).")
    unwritable = log_dir_problem(os.environ.get("TFK8S_LOG_DIR"))
    if unwritable:
        return broken(unwritable)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    script = os.environ.get("TFK8S_SCRIPT")
    code = run_script(script) if script else run_server(tf_config)
    if script and code == 0:
        try:
            leave_together()  # no succeeded peer is taken for crashed (see .leave)
        except SystemExit:  # stopped while it waited: the script had succeeded
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    import atexit

    rc = main()
    # Run the script's exit handlers, then leave without joining threads:
    # TensorFlow's gRPC threads can hang an orderly interpreter shutdown.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
