"""Private network namespaces: the strongest isolation one machine gives a cluster without containers.

TensorFlow's gRPC servers have no authentication and listen on every interface whatever address
TF_CONFIG gives (measured: ``0.0.0.0:PORT``).  A cluster's supervisor and tasks live in a network
namespace of their own (their own loopback), so no other process on the host can connect to a
task's gRPC server at all.  Root needs only CLONE_NEWNET; any other user makes a user namespace
with it (identity uid/gid maps: the tasks keep their uid; capabilities only count inside).  Where
the kernel refuses (user namespaces disabled, seccomp in a container), the plan's fallback (the
loopback shim, :mod:`.shim`) is used and ``status.json`` says why (:mod:`.plan`).

Standalone on purpose (no project import): tests load this file as-is into another user's
process.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

#: ``status.json`` "isolation" modes, strongest first.  ``kernel-netns``: an in-graph cluster
#: in its sandboxed kernel's private namespace (:mod:`tfk8s_magics.kernel.sandbox`).
NETNS, USERNS_NETNS, KERNEL_NETNS, LOOPBACK_SHIM, NONE = (
    "netns", "userns+netns", "kernel-netns", "loopback-shim", "none")

#: Set by the kernel sandbox: the kernel's network namespace (``net:[INODE]``) ...
KERNEL_NETNS_ENV = "TFK8S_KERNEL_NETNS"
#: ... or, where the kernel runs on the host's network, the one sentence saying why.
KERNEL_NOTE_ENV = "TFK8S_KERNEL_NOTE"


def in_kernel_netns() -> bool:
    """Whether this process is in the private network namespace of the sandboxed kernel that
    started it (an in-graph supervisor is; one that left for a namespace of its own is not)."""
    want = os.environ.get(KERNEL_NETNS_ENV)
    try:
        return bool(want) and os.readlink("/proc/self/ns/net") == want
    except OSError:
        return False


class IsolationError(OSError):
    """A namespace operation the kernel refused; the message says which and why."""


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise IsolationError(err, f"{name}() failed: {os.strerror(err)}")


def enter_private_network() -> str:
    """Move this process into a new network namespace with its loopback up; return the mode.

    Must run while the process has one thread (the supervisor, before it starts anything).
    Raises :class:`IsolationError` when the kernel refuses the ``unshare`` (nothing changed
    then); a failure after it (maps, loopback) is an ``OSError`` the caller must treat as fatal.
    """
    uid, gid = os.geteuid(), os.getegid()
    _libc_call("unshare", CLONE_NEWNET if uid == 0 else CLONE_NEWNET | CLONE_NEWUSER)
    if uid != 0:
        # Identity maps: the tasks keep their uid and gid; setgroups must be denied first (kernel rule).
        maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
        for name, text in maps:
            with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                f.write(text)
    _loopback_up()
    return NETNS if uid == 0 else USERNS_NETNS


def make_namespace() -> tuple[str, list[int]]:
    """A spare private network namespace (as :func:`enter_private_network` makes it), held by
    descriptors: ``(mode, fds)``, fds ``[user ns, net ns]`` (``[net ns]`` for root).

    For the warm pool (``pool.py``): a forked child enters the namespace and exits; the
    descriptors keep the namespace alive (with whatever runs in it) and
    :func:`join_namespace` enters it.  Call it from a single-threaded process (it forks).
    Raises :class:`IsolationError` when the kernel refuses the namespace.
    """
    told_r, told_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (coverage does not follow a fork)
        code = 1
        try:
            os.close(told_r)
            os.close(done_w)
            mode = enter_private_network()
            os.write(told_w, mode.encode())
            os.read(done_r, 1)  # until the parent has opened our namespaces
            code = 0
        except OSError as e:
            os.write(told_w, f"!{e.errno or 0}".encode())
        finally:
            os._exit(code)
    os.close(told_w)
    os.close(done_r)
    fds: list[int] = []
    try:
        mode = os.read(told_r, 64).decode()
        if not mode or mode.startswith("!"):
            err = int(mode[1:] or 0) if mode else 0
            raise IsolationError(err, f"unshare() failed: {os.strerror(err) if err else 'no answer'}")
        kinds = ["net"] if mode == NETNS else ["user", "net"]
        for kind in kinds:
            fds.append(os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
        return mode, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        os.close(told_r)
        os.close(done_w)  # the child exits; the descriptors keep its namespaces
        os.waitpid(pid, 0)


def join_namespace(fds: list[int]) -> str:
    """Enter a namespace of :func:`make_namespace` (``fds`` as it returned them); return the mode.

    Must run while the process has one thread (joining a user namespace needs it): before a
    process imports TensorFlow, or the supervisor before it starts anything.  Raises
    :class:`IsolationError` when the kernel refuses.
    """
    types = [CLONE_NEWNET] if len(fds) == 1 else [CLONE_NEWUSER, CLONE_NEWNET]
    for fd, nstype in zip(fds, types, strict=True):
        _libc_call("setns", fd, nstype)
    return NETNS if len(fds) == 1 else USERNS_NETNS


def _loopback_up() -> None:
    """Bring ``lo`` up in this process's network namespace (a new one has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))


def join_cluster_netns(netns: str) -> None:
    """Move the CALLING THREAD into a cluster's network namespace (``status.json`` isolation.netns).

    For a process started outside the cluster (a pre-started task): call it on the thread that
    will create ``tf.distribute.Server``, before creating it; threads it starts later inherit the
    namespace, threads that exist already do not.  Needs CAP_SYS_ADMIN over the namespace's user
    namespace: root can; another user's multithreaded process cannot (joining a user namespace
    needs a single-threaded process), and gets :class:`IsolationError` — start a fresh process then.
    """
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _libc_call("setns", fd, CLONE_NEWNET)
    finally:
        os.close(fd)


def socket_owner(tables: list[int], local_port: int, remote_port: int) -> int | None:
    """The uid owning the TCP socket with ``local_port`` → ``remote_port`` in the given
    ``/proc/net/tcp{,6}`` file descriptors (opened in the namespace to look in), or None."""
    for fd in tables:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        for line in b"".join(chunks).decode("ascii", "replace").splitlines()[1:]:
            parts = line.split()
            if len(parts) < 8:
                continue
            if (int(parts[1].rsplit(":", 1)[1], 16) == local_port
                    and int(parts[2].rsplit(":", 1)[1], 16) == remote_port):
                return int(parts[7])
    return None
