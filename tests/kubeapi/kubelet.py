"""A scriptable kubelet and scheduler for the fake API server (a TEST DOUBLE).

Nothing runs: a test moves pods through their lifecycle by calling methods
(``schedule``, ``run_init``, ``fail_init``, ``run``, ``succeed``). Each step
writes the pod status a real kubelet would write and emits the Events a real
scheduler/kubelet would (Scheduled, Pulling, Pulled, Created, Started,
Killing, ...). Failures, restarts, evictions and scheduling refusals come from
the real kubelet, kwok and scheduler (tests/test_kube_*.py, tests/test_k8s_pods.py). Container logs are lines
the test appends with ``log``; the API serves them on ``pods/NAME/log``.
Pod IPs are data only: nothing listens on them.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import secrets
import threading

from .events import record_event
from .resources import lookup
from .store import Store, WatchEvent, now


def _now_nano() -> str:
    """RFC 3339 with nanoseconds, the format of ``timestamps=true`` log lines."""
    t = dt.datetime.now(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond:06d}000Z"


class PodNotFound(LookupError):
    """The kubelet was asked to act on a pod that is not in the store."""


class SimulatedKubelet:
    """Scripted stand-in for the scheduler and every node's kubelet."""

    def __init__(self, store: Store, nodes: tuple[str, ...] = ("node-1",)):
        self.store = store
        self.nodes = nodes
        self._pods = lookup("pods")
        self._ips = itertools.count(2)
        # Logs per (pod uid, container): a list of segments, one per container
        # instance, so ``previous=true`` and restarts behave like the real kubelet.
        self._logs: dict[tuple[str, str], list[list[tuple[str, str]]]] = {}
        self._log_changed = threading.Condition()
        self._stopped = False
        store.add_observer(self._observe)

    # -- helpers -----------------------------------------------------------

    def _pod(self, namespace: str, name: str) -> dict:
        pod = self.store.get(self._pods, namespace, name)
        if pod is None:
            raise PodNotFound(f"pod {namespace}/{name} does not exist in the fake API server")
        pod.setdefault("status", {})
        return pod

    def _write_status(self, pod: dict) -> dict:
        written = self.store.update(self._pods, pod, subresource="status", check_version=False)
        with self._log_changed:
            self._log_changed.notify_all()
        return written

    def _container_names(self, pod: dict, container: str | None = None) -> list[str]:
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        return [container] if container else names

    def _image(self, pod: dict, container: str) -> str:
        for c in pod["spec"].get("containers") or []:
            if c["name"] == container:
                return c.get("image", "")
        return ""

    def event(self, obj: dict, reason: str, message: str, *, type_: str = "Normal",
              component: str = "kubelet", field_path: str | None = None) -> dict | None:
        """Record a core/v1 Event about ``obj`` (see ``events.record_event``)."""
        return record_event(self.store, obj, reason, message, type_=type_,
                            component=component, field_path=field_path)

    def _set_condition(self, status: dict, type_: str, value: bool, reason: str | None = None,
                       message: str | None = None) -> None:
        conds = [c for c in status.get("conditions") or [] if c["type"] != type_]
        cond = {"type": type_, "status": "True" if value else "False",
                "lastTransitionTime": now()}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        conds.append(cond)
        status["conditions"] = conds

    def _statuses(self, pod: dict) -> dict[str, dict]:
        existing = {s["name"]: s for s in pod["status"].get("containerStatuses") or []}
        out = {}
        for c in pod["spec"].get("containers") or []:
            out[c["name"]] = existing.get(c["name"]) or {
                "name": c["name"], "image": c.get("image", ""), "imageID": "",
                "ready": False, "started": False, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {},
            }
        return out

    def _store_statuses(self, pod: dict, statuses: dict[str, dict]) -> None:
        pod["status"]["containerStatuses"] = list(statuses.values())
        ready = bool(statuses) and all(s["ready"] for s in statuses.values())
        phase = pod["status"].get("phase")
        reason = None if ready else ("PodCompleted" if phase in ("Succeeded", "Failed")
                                     else "ContainersNotReady")
        self._set_condition(pod["status"], "ContainersReady", ready, reason)
        self._set_condition(pod["status"], "Ready", ready, reason)

    # -- lifecycle steps -------------------------------------------------------

    def schedule(self, namespace: str, name: str, node: str | None = None) -> dict:
        """Bind the pod to ``node``: nodeName, PodScheduled=True, a Scheduled event."""
        with self.store.lock:
            pod = self._pod(namespace, name)
            node = node or self.nodes[0]
            if pod["spec"].get("nodeName") == node:
                return pod
            pod["spec"]["nodeName"] = node
            pod = self.store.update(self._pods, pod, check_version=False)
            status = pod.setdefault("status", {})
            self._set_condition(status, "PodScheduled", True)
            self._set_condition(status, "Initialized", True)
            status.update(hostIP="192.168.0.10", hostIPs=[{"ip": "192.168.0.10"}],
                          startTime=now())
            self._store_statuses(pod, self._statuses(pod))
            pod = self._write_status(pod)
            self.event(pod, "Scheduled", f"Successfully assigned {namespace}/{name} to {node}",
                       component="default-scheduler")
            return pod

    def _init_statuses(self, pod: dict) -> dict[str, dict]:
        existing = {s["name"]: s for s in pod["status"].get("initContainerStatuses") or []}
        return {c["name"]: existing.get(c["name"]) or {
            "name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
            "started": False, "restartCount": 0,
            "state": {"waiting": {"reason": "PodInitializing"}}, "lastState": {},
        } for c in pod["spec"].get("initContainers") or []}

    def run_init(self, namespace: str, name: str) -> dict:
        """The first init container runs (phase Pending, the app containers waiting
        ``PodInitializing``, ``Initialized=False``); its log can be written."""
        with self.store.lock:
            pod = self._pod(namespace, name)
            if not pod["spec"].get("nodeName"):
                pod = self.schedule(namespace, name)
            inits = self._init_statuses(pod)
            first = next(iter(inits))
            inits[first].update(started=True, state={"running": {"startedAt": now()}})
            self._open_segment(pod, first)
            pod["status"]["initContainerStatuses"] = list(inits.values())
            self._set_condition(pod["status"], "Initialized", False, "ContainersNotInitialized",
                                f"containers with incomplete status: [{first}]")
            self._store_statuses(pod, self._statuses(pod))
            return self._write_status(pod)

    def fail_init(self, namespace: str, name: str, exit_code: int = 1,
                  message: str | None = None) -> dict:
        """The first init container exits ``exit_code``: with restartPolicy Never the pod
        fails and its app containers never start (waiting ``PodInitializing``)."""
        with self.store.lock:
            pod = self._pod(namespace, name)
            if not pod["spec"].get("nodeName"):
                pod = self.schedule(namespace, name)
            inits = self._init_statuses(pod)
            first = next(iter(inits))
            terminated = {"exitCode": exit_code, "reason": "Error", "startedAt": now(),
                          "finishedAt": now()}
            if message:
                terminated["message"] = message
            inits[first].update(state={"terminated": terminated})
            pod["status"]["initContainerStatuses"] = list(inits.values())
            statuses = self._statuses(pod)
            for cs in statuses.values():
                cs["state"] = {"waiting": {"reason": "PodInitializing"}}
            self._set_condition(pod["status"], "Initialized", False, "ContainersNotInitialized",
                                f"containers with incomplete status: [{first}]")
            pod["status"]["phase"] = "Failed"
            self._store_statuses(pod, statuses)
            return self._write_status(pod)

    def run(self, namespace: str, name: str, node: str | None = None) -> dict:
        """Start every container: phase Running, containers running and ready, a pod IP.

        Init containers first run to completion (exit 0).  (A Secret that does not
        exist is the real kubelet's: tests/test_k8s_pods.py.)
        """
        with self.store.lock:
            pod = self._pod(namespace, name)
            if not pod["spec"].get("nodeName"):
                pod = self.schedule(namespace, name, node)
            inits = self._init_statuses(pod)
            for cs in inits.values():
                if "terminated" not in cs["state"]:
                    if "running" not in cs["state"]:
                        self._open_segment(pod, cs["name"])
                    cs.update(state={"terminated": {"exitCode": 0, "reason": "Completed",
                                                    "startedAt": now(), "finishedAt": now()}})
            if inits:
                pod["status"]["initContainerStatuses"] = list(inits.values())
            statuses = self._statuses(pod)
            for cname, cs in statuses.items():
                image = self._image(pod, cname)
                field = f"spec.containers{{{cname}}}"
                self.event(pod, "Pulling", f'Pulling image "{image}"', field_path=field)
                self.event(pod, "Pulled", f'Successfully pulled image "{image}" in 1.2s '
                                          "(1.2s including waiting)", field_path=field)
                self.event(pod, "Created", f"Created container: {cname}", field_path=field)
                self.event(pod, "Started", f"Started container {cname}", field_path=field)
                cs.update(ready=True, started=True, state={"running": {"startedAt": now()}},
                          imageID=f"docker.io/library/{image}@sha256:{secrets.token_hex(32)}",
                          containerID=f"containerd://{secrets.token_hex(32)}")
                self._open_segment(pod, cname)
            n = next(self._ips)
            ip = f"10.244.{n // 250}.{n % 250 + 1}"
            pod["status"].update(phase="Running", podIP=ip, podIPs=[{"ip": ip}])
            self._store_statuses(pod, statuses)
            return self._write_status(pod)

    def _terminate(self, namespace: str, name: str, exit_code: int, reason: str,
                   container: str | None, message: str | None = None) -> dict:
        with self.store.lock:
            pod = self._pod(namespace, name)
            if pod["status"].get("phase") != "Running":
                pod = self.run(namespace, name)
            statuses = self._statuses(pod)
            policy = pod["spec"].get("restartPolicy", "Always")
            for cname in self._container_names(pod, container):
                cs = statuses[cname]
                started = (cs["state"].get("running") or {}).get("startedAt", now())
                terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started,
                              "finishedAt": now(), "containerID": cs.get("containerID")}
                if message:
                    terminated["message"] = message
                restarts = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
                if restarts:
                    # The kubelet restarts it after a back-off: CrashLoopBackOff.
                    cs.update(ready=False, started=False, lastState={"terminated": terminated},
                              restartCount=cs["restartCount"] + 1,
                              state={"waiting": {
                                  "reason": "CrashLoopBackOff",
                                  "message": f"back-off 10s restarting failed container={cname}"
                                             f" pod={name}_{namespace}({pod['metadata']['uid']})"}})
                    self.event(pod, "BackOff", "Back-off restarting failed container "
                               f"{cname} in pod {name}_{namespace}({pod['metadata']['uid']})",
                               type_="Warning", field_path=f"spec.containers{{{cname}}}")
                else:
                    cs.update(ready=False, started=False, state={"terminated": terminated})
            states = [s["state"] for s in statuses.values()]
            if all("terminated" in s for s in states):
                ok = all(s["terminated"]["exitCode"] == 0 for s in states)
                pod["status"]["phase"] = "Succeeded" if ok else "Failed"
            self._store_statuses(pod, statuses)
            return self._write_status(pod)

    def succeed(self, namespace: str, name: str, exit_code: int = 0,
                container: str | None = None) -> dict:
        """Containers exit 0 (reason Completed); with restartPolicy Never/OnFailure the
        pod becomes Succeeded."""
        return self._terminate(namespace, name, exit_code, "Completed", container)

    def _open_segment(self, pod: dict, container: str) -> None:
        with self._log_changed:
            self._logs.setdefault((pod["metadata"]["uid"], container), []).append([])
            self._log_changed.notify_all()

    def log(self, namespace: str, name: str, text: str, container: str | None = None) -> None:
        """Append line(s) to the current instance of a container's log."""
        pod = self._pod(namespace, name)
        cname = container or pod["spec"]["containers"][0]["name"]
        with self._log_changed:
            segments = self._logs.setdefault((pod["metadata"]["uid"], cname), [[]])
            for line in text.splitlines() or [""]:
                segments[-1].append((_now_nano(), line))
            self._log_changed.notify_all()

    def log_lines(self, uid: str, container: str, previous: bool = False
                  ) -> tuple[list[tuple[str, str]], int] | None:
        """``(lines, segment_index)`` of the current (or previous) instance, or None."""
        with self._log_changed:
            segments = self._logs.get((uid, container)) or []
            index = len(segments) - (2 if previous else 1)
            if index < 0:
                return None
            return list(segments[index]), index

    def wait_for_log(self, uid: str, container: str, segment: int, seen: int,
                     timeout: float) -> None:
        """Block until the segment grows past ``seen`` lines, changes, or timeout."""
        def changed() -> bool:
            segments = self._logs.get((uid, container)) or []
            return (self._stopped or len(segments) != segment + 1
                    or len(segments[segment]) > seen)
        with self._log_changed:
            self._log_changed.wait_for(changed, timeout)

    def _observe(self, event: WatchEvent) -> None:
        if event.kind is not self._pods:
            return
        if event.type == "DELETED":
            with self._log_changed:
                self._log_changed.notify_all()
            for cs in (event.obj.get("status") or {}).get("containerStatuses") or []:
                if "running" in cs.get("state", {}):
                    self.event(copy.deepcopy(event.obj), "Killing",
                               f"Stopping container {cs['name']}",
                               field_path=f"spec.containers{{{cs['name']}}}")

    def stop(self) -> None:
        """Wake log followers (harness shutdown)."""
        self._stopped = True
        with self._log_changed:
            self._log_changed.notify_all()
