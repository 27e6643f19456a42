"""SIGTERM ends a task's script cleanly, even after TensorFlow took the signal for itself.

A stop (``%tfcluster stop``, the dashboard's Stop, a pod's deletion) sends
each task SIGTERM and, after a grace period, SIGKILL.  Measured with
TensorFlow 2.21: once ``MultiWorkerMirroredStrategy()`` enables collective
ops, TensorFlow's coordination service installs a C-level SIGTERM handler
(its preemption notifier) that only records the signal, so the script ran
on until the SIGKILL, 5 s later, with no ``finally`` and no exit handler run.

So the task installs :func:`_on_sigterm` before the script runs and again
right after TensorFlow initialises its context's devices (measured: where
its handler is installed).  The handler first calls the handler TensorFlow
installed (its preemption notifier still hears the signal), then — unless the script built
a ``PreemptionCheckpointHandler``, which saves a checkpoint and exits on its
own — raises :class:`TaskStopped` in the main thread: the script unwinds as
from ``sys.exit`` (``finally`` blocks and ``atexit`` handlers run) and the
task exits with :data:`EXIT_STOPPED` (128 + SIGTERM, the shell's convention).
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading

#: A task's exit code after a stop it honoured (as a shell reports a SIGTERMed command).
EXIT_STOPPED = 128 + signal.SIGTERM


class TaskStopped(SystemExit):
    """Raised in the script's main thread when the task is asked to stop (SIGTERM)."""

    def __init__(self) -> None:
        super().__init__(EXIT_STOPPED)


class _SigAction(ctypes.Structure):
    # glibc's struct sigaction on Linux (x86-64 and aarch64): handler, mask (1024 bits), flags, restorer.
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_SIG_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
#: The C handler someone else installed (TensorFlow's notifier), called before ours acts.
_chained: list = []
#: A PreemptionCheckpointHandler exists: it checkpoints and exits on SIGTERM by itself.
_preemption_handled = False
_stopping = False


def _c_handler() -> int | None:
    """The address of the C handler installed for SIGTERM now (None: default or ignored)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        old = _SigAction()
        if libc.sigaction(signal.SIGTERM, None, ctypes.byref(old)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return old.handler if old.handler not in (None, 0, 1) else None  # SIG_DFL = 0, SIG_IGN = 1


def _on_sigterm(signum, frame) -> None:
    global _stopping
    for fn in _chained:
        fn(signum)
    if _preemption_handled or _stopping:
        return
    _stopping = True
    print("tfk8s: stop requested (SIGTERM): ending the script", file=sys.stderr, flush=True)
    raise TaskStopped()


def requested() -> bool:
    """True once a stop (SIGTERM) reached this task: whatever the script raises after it is the
    stop's doing (TensorFlow's bindings may turn :class:`TaskStopped` into a RuntimeError when
    the signal lands while they build an error of their own)."""
    return _stopping


def install() -> None:
    """Make SIGTERM end the script (main thread only; elsewhere a no-op).  Called again after
    TensorFlow replaced the handler: the handler it installed is kept and called first."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    foreign = _c_handler()
    if current is _on_sigterm and foreign is not None and foreign != _python_handler_address():
        _chained.append(_SIG_HANDLER(foreign))  # kept alive by the list
    signal.signal(signal.SIGTERM, _on_sigterm)


_python_address: list[int] = []


def _python_handler_address() -> int | None:
    """Where Python's own C-level signal trampoline is (what signal.signal installs)."""
    if not _python_address:
        if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            return None
        address = _c_handler()
        if address is None:
            return None
        _python_address.append(address)
    return _python_address[0]


def _reinstalling_after(method):
    """``method``, then :func:`install` (TensorFlow may have replaced the handler inside it)."""
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            install()

    wrapper._tfk8s_sigterm = True
    wrapper.__wrapped__ = method
    return wrapper


def watch_tensorflow() -> None:
    """Re-install the handler each time TensorFlow enables collective ops (its notifier takes
    SIGTERM then), and note a PreemptionCheckpointHandler (it handles SIGTERM itself)."""
    _python_handler_address()  # remember Python's trampoline before TensorFlow replaces it
    try:
        from tensorflow.python.eager import context
    except ImportError:
        return
    # Measured (TF 2.21): the notifier is installed when the context initialises its devices
    # after collective ops were enabled (MultiWorkerMirroredStrategy's constructor).
    for name in ("_initialize_logical_devices", "enable_collective_ops"):
        original = getattr(context.Context, name, None)
        if original is None or getattr(original, "_tfk8s_sigterm", False):
            continue
        setattr(context.Context, name, _reinstalling_after(original))
    try:
        from tensorflow.python.distribute.failure_handling import failure_handling
    except ImportError:
        return
    cls = failure_handling.PreemptionCheckpointHandler
    init = cls.__init__

    def noted_init(self, *args, **kwargs):
        global _preemption_handled
        _preemption_handled = True
        init(self, *args, **kwargs)

    cls.__init__ = noted_init
