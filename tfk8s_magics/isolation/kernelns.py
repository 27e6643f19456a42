"""The sandboxed kernel's host side: the kernel in a private (user+)network namespace.

Why: an in-graph cluster's kernel is its chief, and TensorFlow's gRPC servers have no
authentication.  The kernel's gRPC threads are process-wide and keep the namespace they were
made in, and a multithreaded non-root process cannot enter a user namespace, so the kernel
cannot follow a cluster into one: the kernel itself must start inside.  The launcher
(:mod:`tfk8s_magics.kernel.sandbox`) runs :class:`KernelSandbox` while it still has one thread
when its :class:`~.plan.IsolationPlan` says ``kernel-netns``; the kernel's in-graph clusters (the
supervisor is its child) live in the kernel's namespace, which no other process on the host can
connect into (``status.json``: ``isolation.mode`` ``kernel-netns``).

How (process tree: the Jupyter server → the launcher, the *host side* → the kernel)::

    host side (single-threaded, stays on the host's network)
      ├─ the kernel: forked, unshare(CLONE_NEWUSER | CLONE_NEWNET) (root: CLONE_NEWNET only;
      │  identity uid/gid maps, ``lo`` up — :func:`.netns.enter_private_network`), then
      │  exec ipykernel with the loopback shim preloaded (its chief binds 127.0.0.1 even inside)
      └─ slirp4netns (if installed): the kernel's outbound network, no inbound forwards, no
         access to the host's loopback (``--disable-host-loopback``); ends with the host side

The host side also hands out listening sockets on the host's ``127.0.0.1`` (:mod:`.hostside`) so
a cluster's TensorBoard is reachable by the Jupyter server, through the owner-only relay.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import traceback

from ..lifeline import set_parent_death_signal
from . import hostside, netns

#: How long slirp4netns may take to configure the kernel's tap device.
SLIRP_START_TIMEOUT = 10.0


def _say(text: str) -> None:
    print(f"tfk8s: {text}", file=sys.stderr, flush=True)


class KernelSandbox:
    r"""The host side: fork the kernel into its namespace, give it a network, wait for it.

    ``command`` is what the child ``exec``\ s once inside (the kernel), with ``env``.
    """

    def __init__(self, conn_file: str, command: list[str], env: dict[str, str]) -> None:
        self.command, self.env = command, env
        self.sock_path = os.path.splitext(conn_file)[0] + "-tfk8s.sock"
        self.pid = 0
        self.slirp: subprocess.Popen | None = None
        self.exit_w: int | None = None  # slirp4netns exits when this closes

    def run(self) -> int | str:
        """The kernel's exit code once it ends, or why it could not be sandboxed (nothing left then)."""
        try:
            os.unlink(self.sock_path)  # a dead kernel's (same connection file: a restart)
        except FileNotFoundError:
            pass
        try:
            server = hostside.make_server(self.sock_path)
        except OSError as e:
            return f"the host side's socket {self.sock_path} cannot be made ({e.strerror})"
        status_r, status_w = os.pipe()
        go_r, go_w = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the kernel-to-be
            os.close(status_r)
            os.close(go_w)
            server.close()
            self._child(status_w, go_r, parent)
        os.close(status_w)
        os.close(go_r)
        answer = _read_all(status_r)
        if not answer.startswith("ok"):
            os.waitpid(self.pid, 0)
            os.close(go_w)
            self._close_server(server)
            return f"the kernel refused a private network namespace ({answer[3:] or 'no reason given'})"
        self._outbound()
        os.write(go_w, b"go")
        os.close(go_w)
        return self._wait(server)

    def _child(self, status_w: int, go_r: int, parent: int) -> None:
        """Enter the namespace, tell the host side, wait for its go, become the kernel.  Never returns."""
        try:
            try:
                mode = netns.enter_private_network()
            except OSError as e:
                os.write(status_w, f"no {e.strerror or e}".encode())
                os._exit(0)
            ns = os.readlink("/proc/self/ns/net")
            os.write(status_w, f"ok {mode}".encode())
            os.close(status_w)
            os.read(go_r, 16)  # slirp4netns has configured the tap device (or there is none)
            os.close(go_r)
            # After the namespace is made: a change of credentials would clear it.
            set_parent_death_signal(signal.SIGKILL, parent)
            self.env.update({netns.KERNEL_NETNS_ENV: ns, hostside.ENV: self.sock_path})
            self.env.pop(netns.KERNEL_NOTE_ENV, None)
            os.execve(self.command[0], self.command, self.env)
        except BaseException:  # noqa: BLE001 - a forked child must never return into the caller
            traceback.print_exc()
        os._exit(1)

    def _outbound(self) -> None:
        """Start slirp4netns for the kernel's outbound network, or say once why there is none."""
        exe = shutil.which("slirp4netns")
        if exe is None:
            _say(
                "no slirp4netns on this machine, so this sandboxed kernel has no network (pip, downloads "
                "fail); install it (Debian: apt-get install slirp4netns) for outbound access"
            )
            return
        ready_r, ready_w = os.pipe()
        exit_r, self.exit_w = os.pipe()
        me = os.getpid()
        # --disable-host-loopback: the kernel gets the outside world only; the host's 127.0.0.1
        # (the hub's API, servers that trust local callers) stays out of its reach.
        cmd = [
            exe,
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            f"--ready-fd={ready_w}",
            f"--exit-fd={exit_r}",
            str(self.pid),
            "tap0",
        ]
        try:
            self.slirp = subprocess.Popen(
                cmd,
                pass_fds=(ready_w, exit_r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
            )
        finally:
            os.close(ready_w)
            os.close(exit_r)
        sel = selectors.DefaultSelector()
        sel.register(ready_r, selectors.EVENT_READ)
        ready = bool(sel.select(SLIRP_START_TIMEOUT)) and os.read(ready_r, 1) == b"1"
        sel.close()
        os.close(ready_r)
        if not ready:
            self._stop_slirp()
            _say(
                f"slirp4netns did not start within {SLIRP_START_TIMEOUT:.0f} s (see above), so this "
                "sandboxed kernel has no network (pip, downloads fail)"
            )

    def _stop_slirp(self) -> None:
        if self.exit_w is not None:
            os.close(self.exit_w)
            self.exit_w = None
        if self.slirp is not None:
            try:
                self.slirp.wait(5)
            except subprocess.TimeoutExpired:
                self.slirp.kill()
                self.slirp.wait()
            self.slirp = None

    def _close_server(self, server) -> None:
        server.close()
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass

    def _forward(self, sig: int, _frame) -> None:
        """A signal for the launcher (the pid Jupyter knows) is for the kernel."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def _wait(self, server) -> int:
        """Serve host sockets until the kernel exits; then end slirp4netns; the kernel's exit code."""
        # Jupyter interrupts the kernel's process group: the kernel gets SIGINT itself.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._forward)
        pidfd = os.pidfd_open(self.pid)
        sel = selectors.DefaultSelector()
        sel.register(pidfd, selectors.EVENT_READ, "kernel")
        sel.register(server, selectors.EVENT_READ, "server")
        try:
            done = False
            while not done:
                for key, _ in sel.select():
                    if key.data == "kernel":
                        done = True
                    else:
                        hostside.serve_one(server)
        finally:
            sel.close()
            os.close(pidfd)
            _, status = os.waitpid(self.pid, 0)
            self._stop_slirp()
            self._close_server(server)
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")
