"""What a user is told on Kubernetes is true, on the REAL control plane (tier 1: ``scripts/kube up``).

Every backend acts as the user's own ServiceAccount (the ``kube_user`` fixture). A queued cluster
reads ``pending`` with Kueue's reason even while the namespace's watch is behind the launch (a
loaded machine); a notebook kernel (a real ipykernel, cells with their JupyterLab cell ids) that
stops, re-runs and deletes a cluster prints no traceback, and an interrupted in-graph launch cell
prints one sentence; ``helm uninstall`` stops the users' servers and clusters and removes their
bindings to the deleted ClusterRole, keeping namespaces and home claims unless asked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.realkube import KWOK_ANNOTATIONS, wait_for
from tests.test_kube_controlplane import jobset, spec, task_pods
from tfk8s_magics.backends.base import Phase

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parent.parent


def _kueue_queue(realkube, ns: str, cpu: str = "1") -> None:
    """A ClusterQueue of ``cpu`` CPUs for namespace ``ns`` only, and its LocalQueue ``team``."""
    realkube.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "default-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"cq-{ns}"},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                      "name": "default-flavor",
                      "resources": [{"name": "cpu", "nominalQuota": cpu},
                                    {"name": "memory", "nominalQuota": "12Gi"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "team", "namespace": ns}, "spec": {"clusterQueue": f"cq-{ns}"}},
    ])


def test_a_queued_cluster_is_pending_while_the_watch_has_not_brought_its_jobset(realkube, kube_user,
                                                                                monkeypatch):
    """The cold-CI failure of test_kueue_admits_a_gang_or_keeps_it_queued: on a loaded machine the
    namespace's JobSet watch brings a just-created JobSet seconds later, and the status read
    ``stopped`` ("its JobSet is gone") meanwhile. Here the watch is held back on purpose."""
    from tfk8s_magics.backends.kubernetes.feed import NamespaceFeed
    from tfk8s_magics.spec import Resources

    ns, backend = kube_user("queued")
    _kueue_queue(realkube, ns.name, cpu="1")
    release = threading.Event()
    held = threading.Event()
    deliver = NamespaceFeed._apply_jobset

    def late(self, kind, obj):
        if obj.get("metadata", {}).get("name") == "gang":
            held.set()
            release.wait(60)  # a watch event that arrives late
        deliver(self, kind, obj)

    monkeypatch.setattr(NamespaceFeed, "_apply_jobset", late)
    backend.launch(spec("first", ps=0, workers=1))  # the namespace's watches run from here on
    try:
        big = {"worker": Resources(cpu="2", memory="1Gi"), "ps": Resources(cpu="1", memory="1Gi")}
        st = backend.launch(spec("gang", queue="team", resources=big))
        assert held.wait(30), "the JobSet watch did not bring the new JobSet at all"
        assert jobset(realkube, ns.name, "gang")["spec"].get("suspend") is True  # Kueue holds it
        for seen in (st, backend.status("gang")):
            assert seen.phase == Phase.PENDING, seen
            assert seen.reason.startswith("ps-0: waiting for admission by queue team"), seen.reason
    finally:
        release.set()
    st = wait_for(lambda: "couldn't assign flavors" in (s := backend.status("gang")).reason and s, 60,
                  message="Kueue's reason")
    assert st.phase == Phase.PENDING and not task_pods(realkube, ns.name, "gang")


def test_a_pod_deleted_by_hand_is_the_cause_not_the_peer_that_lost_it(realkube, kube_user):
    """worker-1's pod is deleted by hand (it ends 143), then worker-0, which lost its peer, exits 1
    before JobSet restarts the cluster (the Job and JobSet controllers are held stopped here: a
    loaded machine's delay). The status blamed worker-0, "not retried", although JobSet
    restarts: the deleted pod is the cause, and stays it once its pod is gone."""
    from devcluster.cluster import Cluster

    ns, backend = kube_user("blame")
    c = Cluster()
    backend.launch(spec("blame", restart_budget=2))
    wait_for(lambda: len(p := task_pods(realkube, ns.name, "blame")) == 3
             and all(x.status.phase == "Running" for x in p), 90, message="running pods")
    backend.status("blame")  # the notebook watches it
    expected = (Phase.STARTING, "restarting: worker-1 failed: killed by SIGTERM: its pod was deleted "
                "(2 restarts left)")
    c.procs.stop("jobset")
    c.procs.stop("kube-controller-manager")
    try:
        w0, w1 = task_pods(realkube, ns.name, "blame", "worker")
        realkube.core.delete_namespaced_pod(w1.metadata.name, ns.name)
        wait_for(lambda: realkube.core.read_namespaced_pod(w1.metadata.name, ns.name).status.phase
                 == "Failed", 60, message="the deleted pod to end (kwok: 143)")
        realkube.exit_pod(ns.name, w0.metadata.name, 1)
        wait_for(lambda: realkube.core.read_namespaced_pod(w0.metadata.name, ns.name).status.phase
                 == "Failed", 60, message="worker-0 to fail")
        st = wait_for(lambda: (s := backend.status("blame")).task("worker-0").phase == Phase.FAILED and s,
                      30, message="the watch to see both ends")
        assert (st.phase, st.reason) == expected, st
        c.procs.restart("kube-controller-manager")  # the Job controller lets the deleted pod go
        wait_for(lambda: w1.metadata.name not in [p.metadata.name for p in realkube.pods(ns.name)], 60,
                 message="the deleted pod to go")
        st = backend.status("blame")
        assert (st.phase, st.reason) == expected, st  # gone, it is still the cause
    finally:
        for name in ("kube-controller-manager", "jobset"):
            if not c.procs.alive(name):
                c.procs.restart(name)
    # JobSet's verdict then wins over what the notebook read meanwhile. (Here the Job controller
    # meets both ends in one pass, and podFailurePolicy's FailJob on exit 1 fails the cluster; in
    # the run this reproduces it had counted the deleted pod first, and JobSet restarted.)
    st = wait_for(lambda: ((s := backend.status("blame")).terminal or jobset(
        realkube, ns.name, "blame").get("status", {}).get("restarts", 0) == 1) and s, 120,
        message="JobSet's verdict")
    if st.terminal:
        assert st.phase == Phase.FAILED and "PodFailurePolicy" in st.reason or "failed" in st.reason, st


# -- a real notebook kernel -------------------------------------------------------------------------


class Kernel:
    """A real ipykernel whose cells run with JupyterLab's cell ids, on the user's ServiceAccount."""

    def __init__(self, ns, tmp: Path):
        from jupyter_client import KernelManager

        kube = ns.kube
        cfg = kube.configuration
        token = kube.token(ns.name, ns.service_account)
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "u",
            "clusters": [{"name": "c", "cluster": {"server": cfg.host,
                                                   "certificate-authority": cfg.ssl_ca_cert}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "u", "context": {"cluster": "c", "user": "u", "namespace": ns.name}}],
        }))
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TFK8S_BACKEND": "kubernetes",
               "TFK8S_NAMESPACE": ns.name, "TFK8S_STORAGE_CLASS": "standard", "JUPYTERHUB_USER": "alice",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(tmp))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.seen: list[str] = []  # every text any output carried, from any thread

    def run(self, code: str, cell: str, timeout: float = 180, interrupt_when=None) -> str:
        """Run ``code`` as cell ``cell``; return the text of every output while it ran.
        ``interrupt_when``: a predicate polled meanwhile; once true, the kernel is interrupted (■)."""
        msg = self.kc.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True}, metadata={"cellId": cell})
        self.kc.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        texts: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if interrupt_when is not None and interrupt_when():
                self.km.interrupt_kernel()
                interrupt_when = None
            try:
                m = self.kc.get_iopub_msg(timeout=1)
            except Exception:  # noqa: BLE001 - queue.Empty: keep waiting
                continue
            texts.append(_text(m))
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" and \
                    m["parent_header"].get("msg_id") == msg_id:
                break
        else:
            raise AssertionError(f"cell {cell} did not finish in {timeout} s: {''.join(texts)[-2000:]}")
        out = "".join(texts)
        self.seen.append(out)
        return out

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def jobset_exists(realkube, ns: str, name: str) -> bool:
    return any(j["metadata"]["name"] == name for j in realkube.custom.list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets")["items"])


def _text(m: dict) -> str:
    c = m.get("content") or {}
    if m["msg_type"] == "stream":
        return c.get("text", "")
    if m["msg_type"] == "error":
        return f"{c.get('ename')}: {c.get('evalue')}\n" + "\n".join(c.get("traceback") or [])
    if m["msg_type"] in ("display_data", "update_display_data", "execute_result"):
        return str((c.get("data") or {}).get("text/plain", "")) + "\n"
    return ""


@pytest.fixture
def kernel(kube_user, tmp_path):
    ns, backend = kube_user("kernel")
    k = Kernel(ns, tmp_path)
    yield ns, backend, k
    k.close()


SCRIPT_CELL = "%%tfcluster launch c8 --workers 1 --ps 0\nprint('training')\n"


def test_stop_rerun_refused_rerun_then_delete_prints_no_traceback(realkube, kernel):
    """Item: launch → stop → re-run (replaces it; the old dashboard is freed) → a refused re-run
    → delete printed ``TypeError: 'NoneType' object is not callable`` twice (the freed view redrawn)."""
    ns, backend, k = kernel
    k.run("%load_ext tfk8s_magics", "load")
    k.run(SCRIPT_CELL, "launch")
    wait_for(lambda: backend.status("c8").phase == Phase.RUNNING, 90, message="c8 running")
    out = k.run("%tfcluster stop c8", "stop")
    assert "c8: stop" in out, out
    out = k.run(SCRIPT_CELL, "launch")  # the re-run replaces the stopped cluster
    assert "Traceback" not in out and "Error" not in out, out
    wait_for(lambda: backend.status("c8").phase == Phase.RUNNING, 90,
             message=f"the re-run c8 running (the cell said: {out[-2000:]})")
    out = k.run(SCRIPT_CELL, "launch")  # refused: it runs
    assert "is still running" in out and "Traceback" not in out, out
    out = k.run("%tfcluster delete c8", "delete")
    assert "c8: deleted" in out, out
    time.sleep(2)  # anything a view's thread would still print
    every = "".join(k.seen) + k.run("print('end')", "end")
    assert "Traceback" not in every and "TypeError" not in every, every[-4000:]


def test_an_interrupted_in_graph_launch_says_one_sentence(realkube, kernel):
    """An in-graph launch cell waits for its servers; a cluster held by a queue nobody serves never
    gets them: ■ (KeyboardInterrupt) ends the wait with one line, not a traceback."""
    ns, backend, k = kernel
    # a LocalQueue of a ClusterQueue that does not exist: Kueue admits nothing from it (a queue the
    # namespace lacks altogether is refused at launch)
    realkube.custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns.name, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "nobody", "namespace": ns.name}, "spec": {"clusterQueue": "nobody"}})
    k.run("%load_ext tfk8s_magics", "load")
    since = []

    def waiting() -> bool:  # the launch is done and the cell waits for the servers
        if not since and jobset_exists(realkube, ns.name, "ig"):
            since.append(time.monotonic())
        return bool(since) and time.monotonic() - since[0] > 3

    out = k.run("%tfcluster launch ig --mode in-graph --ps 1 --workers 1 --queue nobody",
                "launch", interrupt_when=waiting)
    assert "ig: interrupted while waiting for its servers to be ready" in out, out
    assert "%tfcluster stop ig" in out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert backend.status("ig").phase == Phase.PENDING  # it goes on, as the sentence says
    k.run("%tfcluster delete ig", "delete")


# -- helm uninstall ---------------------------------------------------------------------------------


def _helm(request, tmp_path_factory):
    from test_helm import helm_binary

    return helm_binary(request, tmp_path_factory)


@pytest.mark.parametrize("remove", [False, True], ids=["namespaces-kept", "namespaces-removed"])
def test_helm_uninstall_stops_servers_and_clusters_and_unbinds_the_deleted_role(
        realkube, request, tmp_path_factory, remove):
    """A release with a user namespace holding a notebook server, a home claim and a running
    TensorFlow cluster; ``helm uninstall`` runs the chart's pre-delete hook. kwok plays the node,
    so the hook pod's container is what this test runs: the pod's own command, with the hook
    ServiceAccount's token, then the pod ends with its exit code (kwok's stage)."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "hub_config"))
    from tfk8s_hub.bootstrap import BootstrapSpec, bootstrap_objects, namespace_labels

    from tfk8s_magics.backends.kubernetes import KubernetesBackend

    helm = _helm(request, tmp_path_factory)
    core = realkube.core
    hub_ns, release = f"unhub-{uuid.uuid4().hex[:5]}", "un"
    role = f"tfk8s-backend-{hub_ns}"
    core.create_namespace({"metadata": {"name": hub_ns, "annotations": dict(KWOK_ANNOTATIONS)}})
    realkube._namespaces.append(hub_ns)
    cmd = [str(helm), "--kubeconfig", realkube.kubeconfig, "-n", hub_ns]
    r = subprocess.run([*cmd, "install", release, str(REPO / "helm" / "tfk8s-lab"), "--wait=false",
                        "--set", f"uninstall.removeNamespaces={str(remove).lower()}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # a user namespace as the hub makes it (labels, bootstrap objects), a server, a home claim
    boot = BootstrapSpec(hub_namespace=hub_ns, role_name=role)
    user_ns = f"{hub_ns}-ada"
    core.create_namespace({"metadata": {"name": user_ns, "labels": namespace_labels(boot),
                                        "annotations": dict(KWOK_ANNOTATIONS)}})
    realkube._namespaces.append(user_ns)
    realkube.apply(bootstrap_objects(boot, user_ns))
    core.create_namespaced_persistent_volume_claim(user_ns, {
        "metadata": {"name": "home-ada"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "standard",
                 "resources": {"requests": {"storage": "1Gi"}}}})
    core.create_namespaced_pod(user_ns, {
        "metadata": {"name": "jupyter-ada", "labels": {"component": "singleuser-server"}},
        "spec": {"containers": [{"name": "notebook", "image": "tfk8s/notebook:0.1.0",
                                 "securityContext": {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]},
                                                     "runAsNonRoot": True, "runAsUser": 1000,
                                                     "seccompProfile": {"type": "RuntimeDefault"}},
                                 "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                               "limits": {"memory": "256Mi"}}}]}})
    token = realkube.token(user_ns, boot.service_account)
    backend = KubernetesBackend(namespace=user_ns, api_client=realkube.client_with_token(token),
                                user="ada", storage_class="standard")
    try:
        backend.launch(spec("run"), detach=True)
        wait_for(lambda: len(task_pods(realkube, user_ns, "run")) == 3, 90, message="the cluster's pods")
    finally:
        backend.close()

    uninstall = subprocess.Popen([*cmd, "uninstall", release, "--timeout", "240s"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ran = None

    def hook_pods():
        return [p for p in core.list_namespaced_pod(
            hub_ns, label_selector="app.kubernetes.io/component=uninstall").items
            if p.status.phase == "Running"]

    try:
        wait_for(lambda: hook_pods() or uninstall.poll() is not None, 120,
                 message="the uninstall hook's pod (or the end of the uninstall)")
        if uninstall.poll() is None:  # the hook runs: do what its container would
            ran = _run_hook(realkube, hook_pods()[0], hub_ns, release, tmp_path_factory)
        out, err = uninstall.communicate(timeout=240)
    finally:
        if uninstall.poll() is None:
            uninstall.kill()
    assert uninstall.returncode == 0, out + err
    if ran is not None:
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert f"{user_ns}: removed" in ran.stdout, ran.stdout

    def bound() -> list[str]:
        from kubernetes.client import RbacAuthorizationV1Api

        return [b.metadata.name for b in RbacAuthorizationV1Api(realkube.admin).list_namespaced_role_binding(
            user_ns).items if b.role_ref.name == role]

    if remove:
        wait_for(lambda: _namespace_phase(core, user_ns) in (None, "Terminating"), 60,
                 message="the user namespace to go")
    else:
        wait_for(lambda: not core.list_namespaced_pod(
            user_ns, label_selector="component=singleuser-server").items, 60, message="the server to stop")
        wait_for(lambda: not realkube.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", user_ns, "jobsets")["items"], 60, message="the cluster to stop")
        assert not bound(), "a RoleBinding to the deleted ClusterRole is left"
        assert _namespace_phase(core, user_ns) == "Active"
        assert core.read_namespaced_persistent_volume_claim("home-ada", user_ns)  # the user's work stays
        assert core.read_namespaced_config_map("run", user_ns)  # the cluster's record too
    # the hook leaves nothing of its own: no ServiceAccount, ClusterRole or Job
    from devcluster.cluster import Cluster

    left = Cluster().kubectl("get", "clusterrole,clusterrolebinding", "-o", "name").stdout
    assert f"{release}-tfk8s-lab-uninstall" not in left, left


def _run_hook(realkube, hook, hub_ns: str, release: str, tmp_path_factory):
    """Run the hook pod's own command as its ServiceAccount (kwok runs no container), then end
    the pod with that exit code (kwok's stage), as the kubelet would."""
    container = hook.spec.containers[0]
    assert container.image.startswith("tfk8s/hub:")
    assert hook.spec.service_account_name == f"{release}-tfk8s-lab-uninstall"
    argv = container.command[container.command.index("-m"):]
    token = realkube.token(hub_ns, hook.spec.service_account_name)
    conf = tmp_path_factory.mktemp("hook") / "kubeconfig"
    cfg = realkube.configuration
    conf.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "h",
        "clusters": [{"name": "c", "cluster": {"server": cfg.host,
                                               "certificate-authority": cfg.ssl_ca_cert}}],
        "users": [{"name": "h", "user": {"token": token}}],
        "contexts": [{"name": "h", "context": {"cluster": "c", "user": "h"}}]}))
    env = {**os.environ, "KUBECONFIG": str(conf),
           "PYTHONPATH": os.pathsep.join([str(REPO / "hub_config"), str(REPO)])}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    ran = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120)
    realkube.exit_pod(hub_ns, hook.metadata.name, ran.returncode)
    return ran


def _namespace_phase(core, name: str) -> str | None:
    from kubernetes.client.rest import ApiException

    try:
        return core.read_namespace(name).status.phase
    except ApiException as e:
        if e.status == 404:
            return None
        raise
