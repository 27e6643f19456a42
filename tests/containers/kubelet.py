"""A kubelet for the API test double that runs its pods as real podman containers (a TEST HARNESS).

The Kubernetes backend launches against ``tests/kubeapi`` (no real cluster
here); every Pod it creates there is started with podman from the pod *as
stored by the API* (through :mod:`.pods`, so as written or refused); once
the pod's own readiness probe passes in the container, the double's
kubelet marks it Running and Ready; a deleted Pod gets SIGTERM, as the
kubelet sends it, and its container's exit code is kept.
"""

from __future__ import annotations

import queue
import threading

from tests.kubeapi.resources import lookup

from .podman import PodmanRun
from .pods import PodInstance, container_plan

_PLACEMENT = {"nodeName", "schedulerName", "priority", "preemptionPolicy", "serviceAccount"}


class PodmanKubelet:
    """Realise the Pods of one namespace of a :class:`~tests.kubeapi.KubeHarness` with podman."""

    def __init__(self, kube, run: PodmanRun, namespace: str) -> None:
        self.kube, self.run, self.namespace = kube, run, namespace
        self.plans: dict[str, object] = {}
        self.exit_codes: dict[str, int] = {}
        self.errors: list[BaseException] = []
        self._queue: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._pods = lookup("pods")
        self._done = threading.Condition()
        kube.store.add_observer(self._observe)
        self._loop = threading.Thread(target=self._serve, name="podman-kubelet", daemon=True)
        self._loop.start()

    def _observe(self, event) -> None:
        # called inside the store's lock: only hand the work over
        meta = event.obj["metadata"]
        if event.kind is self._pods and meta.get("namespace") == self.namespace:
            if event.type in ("ADDED", "DELETED"):
                self._queue.put((event.type, meta["name"]))

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, name = item
            target = self._start if kind == "ADDED" else self._stop
            t = threading.Thread(target=self._guard, args=(target, name), name=f"podman-kubelet-{name}")
            t.start()
            self._threads.append(t)

    def _guard(self, fn, name: str) -> None:
        try:
            fn(name)
        except BaseException as e:  # noqa: BLE001 - reported by close()
            self.errors.append(e)

    def _objects(self) -> list[dict]:
        out = []
        for kind, api_version in (("configmaps", "v1"), ("services", "v1"),
                                  ("persistentvolumeclaims", "v1")):
            for obj in self.kube.list_objects(kind, self.namespace):
                out.append({"apiVersion": api_version, "kind": lookup(kind).kind, **obj})
        return out

    def _start(self, name: str) -> None:
        pod = self.kube.get_object("pods", name, self.namespace)
        meta = pod["metadata"]
        instance = PodInstance(name, self.namespace, dict(meta.get("labels", {})),
                               dict(meta.get("annotations", {})), pod["spec"])
        # what the API server and the scheduler filled in (placement only: one machine needs none);
        # every other field goes to the mapping, which refuses what it cannot reproduce
        instance.spec = {k: v for k, v in pod["spec"].items() if k not in _PLACEMENT}
        image = instance.spec["containers"][0]["image"]
        plan = container_plan(instance, self._objects(), prefix=self.run.prefix,
                              network=self.run.ensure_network(), image_user=self.run.image_user(image))
        self.plans[name] = plan
        self.run.start(plan)
        self.run.wait_ready(plan)
        self.kube.kubelet.run(self.namespace, name)

    def _stop(self, name: str) -> None:
        plan = self.plans.get(name)
        if plan is None:
            return
        self.run.kill(plan.container, "TERM")
        code = self.run.wait_exit(plan.container, timeout=120)
        with self._done:
            self.exit_codes[name] = code
            self._done.notify_all()

    def wait_stopped(self, names: list[str], timeout: float = 120) -> dict[str, int]:
        """The exit codes of ``names`` once every one of them was stopped."""
        with self._done:
            ok = self._done.wait_for(lambda: all(n in self.exit_codes for n in names), timeout)
        assert ok, f"not stopped after {timeout} s: {[n for n in names if n not in self.exit_codes]}"
        return {n: self.exit_codes[n] for n in names}

    def close(self) -> None:
        """Stop serving; join every worker thread; raise the first error a pod hit."""
        self._queue.put(None)
        self._loop.join(30)
        for t in self._threads:
            t.join(180)
        if self.errors:
            raise self.errors[0]
