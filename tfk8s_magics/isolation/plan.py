"""What isolates a cluster (or a kernel) and why: ONE decision, made once, consumed by everyone.

:func:`plan_cluster` (a cluster's supervisor and the warm pool), :func:`plan_kernel` (the
kernel launcher) and :func:`plan_server` (a TensorBoard's or model server's guard) turn the
platform's capabilities (:class:`Platform`: is there a loopback shim, is this process in its
sandboxed kernel's private namespace) and the ``isolation`` setting into an
:class:`IsolationPlan`: the namespace kind, the loopback shim, the owner-only relay, the
fallback where the kernel refuses a namespace, and the one sentence saying why.  The consumers
perform the plan (enter the namespace, preload the shim, start the relay); none of them decides.

Pure but for :meth:`Platform.here`, which reads this process's platform: every rule is tested
against literal platforms (``tests/test_isolation_plan.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .netns import KERNEL_NETNS, KERNEL_NOTE_ENV, LOOPBACK_SHIM, NETNS, NONE, in_kernel_netns

#: The ``isolation`` setting's values (``$TFK8S_ISOLATION``, option ``isolation``).
SETTINGS = ("netns", "loopback", "off")

#: Why an in-graph cluster gets no private network namespace (shown in ``status.json``).
IN_GRAPH_NO_NETNS = ("in-graph: the notebook kernel is the chief and its servers dial it, so they "
                     "share the host's loopback (behind the loopback shim), not a private namespace")
#: An in-graph cluster started from a sandboxed kernel (``isolation.mode`` ``kernel-netns``).
IN_GRAPH_KERNEL_NETNS = ("in-graph: its tasks share the sandboxed kernel's private network namespace "
                         "(the kernel is the chief), which no other process on the host can connect into")
#: Why a cluster whose tasks stream from ``$TFK8S_DATA_URL`` gets no private network namespace.
STREAMS_NO_NETNS = ("its tasks stream --data-dir's URL ($TFK8S_DATA_URL), which needs the host's network, "
                    "so they share the host's loopback (behind the loopback shim); --data-sync copies the "
                    "data first and keeps a private namespace")
#: A cluster in a namespace of its own.
PRIVATE = "a private network namespace"


def wanted(value: str | None = None) -> str:
    """What option ``isolation`` (``$TFK8S_ISOLATION``, read here when ``value`` is None) asks
    for: ``netns`` (default, and for anything unknown: never weaker by a typo), ``loopback``
    (the shim only) or ``off``."""
    if value is None:
        value = os.environ.get("TFK8S_ISOLATION")
    value = (value or "netns").strip().lower()
    return value if value in SETTINGS else "netns"


@dataclass(frozen=True)
class Platform:
    """What this machine and this process offer isolation.

    ``shim``: the compiled loopback shim (None: ``TFK8S_LOOPBACK_ONLY=0`` or no C compiler);
    ``kernel_netns``: this process is in the private namespace of the sandboxed kernel that
    started it; ``kernel_note``: the sentence the kernel launcher said when it ran the kernel on
    the host's network ("" otherwise).
    """

    shim: str | None = None
    kernel_netns: bool = False
    kernel_note: str = ""

    @classmethod
    def here(cls, shim: str | None = None) -> Platform:
        """This process's platform; ``shim`` as the caller found it (a cluster's record keeps
        the one its launch found, so its supervisor does not compile it again)."""
        return cls(shim=shim, kernel_netns=in_kernel_netns(),
                   kernel_note=os.environ.get(KERNEL_NOTE_ENV, "").strip())


@dataclass(frozen=True)
class IsolationPlan:
    """How one cluster, kernel or server is isolated, and why.

    ``kind`` is the namespace kind: ``netns`` (a private namespace of its own, made or joined
    by whoever performs the plan; ``userns+netns`` is the same for a non-root user),
    ``kernel-netns`` (the sandboxed kernel's), ``loopback-shim`` or ``none`` (the host's
    network).  ``shim``: the library to preload into its processes (None: none).  ``relay``:
    whether its servers go behind the owner-only relay (:mod:`.guard`).  ``fallback``: the kind
    used where the kernel refuses the namespace.  ``reason``: one sentence, shown in
    ``status.json`` and by the kernel.
    """

    kind: str
    reason: str
    shim: str | None = None
    relay: bool = False
    fallback: str = NONE
    fallback_shim: str | None = field(default=None, repr=False)

    @property
    def private(self) -> bool:
        """Whether the plan is a namespace of its own (to make or join), not the caller's."""
        return self.kind == NETNS

    def status(self, mode: str | None = None, netns: str | None = None) -> dict:
        """The ``status.json`` "isolation" record once performed: ``mode`` is what entering the
        namespace gave (``netns``/``userns+netns``; default: the plan's kind)."""
        return {"mode": mode or self.kind, "reason": self.reason, "netns": netns}

    def refused(self, why: str) -> IsolationPlan:
        """The plan after the kernel refused the namespace (``why``: its error), one sentence on it."""
        return IsolationPlan(kind=self.fallback, shim=self.fallback_shim, relay=False,
                             reason=f"no private network namespace here ({why}); {self.fallback} instead")


def plan_cluster(platform: Platform, setting: str | None, *, in_graph: bool,
                 streams: bool = False) -> IsolationPlan:
    """A local cluster's plan.  A between-graph cluster gets a private namespace unless the
    setting says otherwise or its tasks stream from a URL (they need the host's network).  An
    in-graph cluster stays in its kernel's namespace — the kernel is the chief and its servers
    dial it — which is private when the kernel was sandboxed (``kernel-netns``), else the
    host's, behind the loopback shim.  ``streams``: its tasks read ``$TFK8S_DATA_URL``."""
    want = wanted(setting)
    relay = want == "netns"
    shim = platform.shim if want != "off" else None
    if want == "netns" and in_graph and platform.kernel_netns:
        return IsolationPlan(KERNEL_NETNS, IN_GRAPH_KERNEL_NETNS, shim=platform.shim, relay=relay)
    if want != "netns" or in_graph or streams:
        if want != "netns":
            why = f"TFK8S_ISOLATION={want}"
        elif in_graph:
            note = platform.kernel_note
            why = f"{IN_GRAPH_NO_NETNS}; {note}" if note else IN_GRAPH_NO_NETNS
        else:
            why = STREAMS_NO_NETNS
        return IsolationPlan(LOOPBACK_SHIM if shim else NONE, why, shim=shim, relay=relay)
    return IsolationPlan(NETNS, PRIVATE, relay=True, fallback=LOOPBACK_SHIM if shim else NONE,
                         fallback_shim=shim)


def plan_server(setting: str | None) -> IsolationPlan:
    """A TensorBoard's or model server's plan (:mod:`.guard`): its own namespace behind the
    owner-only relay, unless the setting is ``loopback`` or ``off``; the host's loopback where
    the kernel refuses the namespace."""
    want = wanted(setting)
    if want != "netns":
        return IsolationPlan(NONE, f"TFK8S_ISOLATION={want}")
    return IsolationPlan(NETNS, PRIVATE, relay=True)


def plan_pool(platform: Platform, setting: str | None) -> IsolationPlan:
    """What a warm pool's processes preload and where a between-graph launch's processes wait:
    the shim unless isolation is ``off`` (a task behind no shim switches it off); a spare
    private namespace when the clusters they serve would get one."""
    want = wanted(setting)
    shim = platform.shim if want != "off" else None
    if want != "netns":
        return IsolationPlan(LOOPBACK_SHIM if shim else NONE, f"TFK8S_ISOLATION={want}", shim=shim)
    return IsolationPlan(NETNS, PRIVATE, shim=shim, relay=True, fallback=LOOPBACK_SHIM if shim else NONE,
                         fallback_shim=shim)


def plan_kernel(platform: Platform, setting: str | None, transport: str | None,
                refused: str = "") -> IsolationPlan:
    """The notebook kernel's plan (:mod:`tfk8s_magics.kernel.sandbox`): a private namespace of
    its own when the setting allows and its Jupyter channels are unix sockets (``transport``
    ``ipc``: TCP ports inside would be out of the Jupyter server's reach), else the host's
    network with the shim.  ``refused``: why a namespace cannot be had (a connection file that
    cannot be read)."""
    want = wanted(setting)
    if want != "netns":
        why = f"TFK8S_ISOLATION={want}"
    elif refused:
        why = refused
    elif transport != "ipc":
        why = (f"its connection file asks for {transport} transport, whose ports the Jupyter server must "
               "reach on the host (the lab starts kernels with transport ipc)")
    else:
        return IsolationPlan(KERNEL_NETNS, PRIVATE, shim=platform.shim, relay=True,
                             fallback=LOOPBACK_SHIM if platform.shim else NONE, fallback_shim=platform.shim)
    return IsolationPlan(LOOPBACK_SHIM if platform.shim else NONE, host_network_note(why, platform.shim),
                         shim=platform.shim)


def host_network_note(why: str, shim: str | None) -> str:
    """The one sentence a kernel on the host's network says once (and its clusters' status)."""
    chief = (
        "the loopback shim keeps its own chief server off other interfaces"
        if shim
        else "and its chief server listens on every interface (no loopback shim: no C compiler)"
    )
    return (
        f"this kernel runs on the host's network because {why}, so its in-graph clusters share the "
        f"host's loopback, where any local user can connect to them; {chief}"
    )
