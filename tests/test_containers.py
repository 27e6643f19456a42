"""Real containers: the three images built with podman, and rendered clusters run as containers.

The images are built (cached by a hash of their inputs) from a Debian base
made by ``scripts/base-image``; the clusters are what ``render`` produces,
started one container per pod by ``tests/containers`` exactly as the pod
templates say (image, command, env, user, read-only root, dropped
capabilities, volumes, DNS names) or refused.  Without podman these tests
skip, except in CI (``CI=true``), where a missing podman is a failure.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

import tfk8s_magics as tk
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.spec import ClusterSpec

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).parent / "scripts"
ARTIFACTS = REPO / "test-artifacts"
NAMESPACE = "lab-test"

# Printed first by every script these tests run: who the task is and what it may touch.
PROBE = '''import os as _os
print("UID", _os.getuid(), "GROUPS", sorted(_os.getgroups()), flush=True)
try:
    open(_os.path.expanduser("~tf") + "/probe", "w")
    print("ROOTFS writable", flush=True)
except OSError as _e:
    print("ROOTFS errno", _e.errno, flush=True)
print("CAPEFF", [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0], flush=True)
print("TF_CONFIG", _os.environ["TF_CONFIG"], flush=True)
'''


def record(key: str, value) -> None:
    """Keep a measurement in test-artifacts/containers.json (docs/admins/images.md quotes the image sizes)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "containers.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """The task, notebook and hub images (built once, then found by their input hash)."""
    if not shutil.which("podman"):
        message = "podman is not installed: run scripts/bootstrap containers (podman, runc, debootstrap)"
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the container tests: " + message)
        pytest.skip(message)
    ARTIFACTS.mkdir(exist_ok=True)
    start = time.monotonic()
    with open(ARTIFACTS / "image-build.log", "w") as log:
        r = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "build_images.py"), "task", "notebook", "hub"],
            stdout=subprocess.PIPE, stderr=log, text=True, timeout=3600)
    tail = (ARTIFACTS / "image-build.log").read_text()[-4000:]
    assert r.returncode == 0, tail
    report = json.loads(tail.strip().splitlines()[-1])
    report["total_seconds"] = round(time.monotonic() - start, 1)
    record("build", report)
    return dict(line.split() for line in r.stdout.splitlines())


@pytest.fixture
def pods(tmp_path):
    """A PodmanRun with a unique prefix; afterwards nothing of it may be left in podman."""
    from tests.containers.podman import PodmanRun

    run = PodmanRun(f"tfk8s-{os.getpid()}-{secrets.token_hex(3)}", tmp_path / "podman")
    try:
        yield run
    finally:
        run.cleanup()
    assert not run.leftovers(), f"left in podman: {run.leftovers()}"


def render(**spec) -> list[dict]:
    """What ``render`` produces for ``spec`` in namespace ``lab-test`` (parsed back from its YAML)."""
    text = tk.render(ClusterSpec(**spec), KubernetesBackend(namespace=NAMESPACE, user="alice"))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def stamps(pods, name: str, pattern: str) -> list[float]:
    """Wall-clock times (epoch s) of the container's output lines matching ``pattern``."""
    out = []
    for line in pods.run("logs", "--timestamps", name).stdout.splitlines():
        stamp, _, text = line.partition(" ")
        if re.search(pattern, text):
            out.append(dt.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp())
    return out


def read_from_notebook(pods, images, claim: str, code: str) -> str:
    """Run ``code`` in a container of the notebook image (its own user) with ``claim`` at /log, read-only."""
    from tests.containers.podman import build_images

    r = pods.run("run", "--rm", "--network", "none", *build_images.run_flags(), "--read-only",
                 "--label", f"tfk8s.test-run={pods.prefix}", "--tmpfs", "/tmp",
                 "-v", f"{pods.volumes[claim]}:/log:ro", images["notebook"], "python", "-c", code,
                 check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_images_are_built_and_plain_task_image_has_no_gpu_stack(images, pods):
    for name, ref in images.items():
        assert pods.run("image", "exists", ref, check=False).returncode == 0, name
    task_env = pods.run("image", "inspect", "--format", "{{json .Config.Env}}", images["task"]).stdout
    assert "TFK8S_ACCELERATOR=cpu" in task_env
    # the plain image has no CUDA libraries: TensorFlow sees no GPU and says so
    code = ("import importlib.util as u, tensorflow as tf; "
            "print(u.find_spec('nvidia') is None, tf.config.list_physical_devices('GPU'))")
    out = pods.run("run", "--rm", *pods_flags(), "--entrypoint", '["python", "-c"]', images["task"], code,
                   timeout=300).stdout
    assert out.strip().splitlines()[-1] == "True []", out
    hub = pods.run("run", "--rm", *pods_flags(), images["hub"], "python", "-c",
                   "import psycopg2, oauthenticator, jupyterhub_idle_culler, kubespawner; print('ok')",
                   timeout=120).stdout
    assert hub.strip() == "ok"


def pods_flags() -> list[str]:
    """Flags of a one-off container of these tests (ulimits, no network)."""
    from tests.containers.podman import build_images

    return ["--network", "none", *build_images.run_flags()]


def test_mwms_workers_all_reduce_across_containers(images, pods):
    script = PROBE + (SCRIPTS / "mwms_keras.py").read_text()
    objects = render(name="mwms", workers=2, ps=0, script=script, image=images["task"])
    plans = pods.plans(objects)
    # named as JobSet names them: Job mwms-worker-0, completion index i
    assert [p.pod.name for p in plans] == ["mwms-worker-0-0", "mwms-worker-0-1"]
    assert [p.dns_names for p in plans] == [
        [f"mwms-worker-0-{i}.mwms.{NAMESPACE}.svc.cluster.local"] for i in (0, 1)]
    t0 = time.time()
    for p in plans:
        pods.start(p)
    codes = [pods.wait_exit(p.container, timeout=600) for p in plans]
    logs = [pods.logs(p.container) for p in plans]
    assert codes == [0, 0], "\n".join(logs)[-6000:]
    for i, log in enumerate(logs):
        # each worker got the sum of both workers' values: a real all-reduce across containers
        assert "ALLREDUCE 3.0" in log and "KERAS tf_keras" in log, log[-3000:]
        # as the pod says: uid 1000 (its own group 1000) with the lab's one fsGroup, 100 (the
        # notebook's), read-only root (EROFS), no capabilities
        assert "UID 1000 GROUPS [100, 1000]" in log and "ROOTFS errno 30" in log, log[:2000]
        assert "CAPEFF 0000000000000000" in log
        tf_config = json.loads(re.search(r"^TF_CONFIG (.*)$", log, re.M).group(1))
        assert tf_config["task"] == {"type": "worker", "index": i}
        assert tf_config["cluster"]["worker"] == [
            f"mwms-worker-0-{j}.mwms.{NAMESPACE}.svc:2222" for j in (0, 1)]
    first_step = min(stamps(pods, plans[0].container, r"^ALLREDUCE"))
    trained = max(stamps(pods, plans[0].container, r"^KERAS"))
    record("mwms", {"podman_run_to_first_allreduce_s": round(first_step - t0, 1),
                    "podman_run_to_fit_done_s": round(trained - t0, 1)})
    # every task's log kept on the shared /log claim, readable from the user's notebook container
    out = read_from_notebook(pods, images, "mwms-log", "import pathlib; p = pathlib.Path('/log/tasks'); "
                             "print(sorted(x.name for x in p.iterdir())); "
                             "print(p.joinpath('worker-1.log').read_text())")
    assert "['worker-0.log', 'worker-1.log']" in out and "ALLREDUCE 3.0" in out


def test_parameter_server_holds_the_variables_and_checkpoints_on_shared_log(images, pods):
    script = PROBE + (SCRIPTS / "tf1_ps_checkpoint.py").read_text()
    objects = render(name="tf1", workers=2, ps=1, script=script, image=images["task"], ps_grace_period=0)
    plans = {p.pod.name: p for p in pods.plans(objects)}
    assert list(plans) == ["tf1-ps-0-0", "tf1-worker-0-0", "tf1-worker-0-1"]
    t0 = time.time()
    for p in plans.values():
        pods.start(p)
    ps, workers = plans["tf1-ps-0-0"], [plans["tf1-worker-0-0"], plans["tf1-worker-0-1"]]
    pods.wait_ready(ps)  # the pod's own readiness probe: the server's port is bound
    codes = [pods.wait_exit(w.container, timeout=600) for w in workers]
    logs = [pods.logs(w.container) for w in workers]
    assert codes == [0, 0], "\n".join(logs)[-6000:]
    devices = dict(re.findall(r"^DEVICE (\S+) (\S+)$", logs[0], re.M))
    assert set(devices) == {"global_step", "w", "b"}
    assert all(d.startswith("/job:ps/task:0") for d in devices.values()), devices
    assert all("GLOBAL_STEP 40" in log for log in logs), logs
    first = min(stamps(pods, workers[0].container, r"^FIRST_STEP"))
    record("ps", {"podman_run_to_first_step_s": round(first - t0, 1)})
    # The PS serves until stopped: the kubelet's SIGTERM must show as 143 through PID 1 (logcopy).
    assert pods.state(ps.container)[0] == "running"
    pods.kill(ps.container, "TERM")
    assert pods.wait_exit(ps.container, timeout=60) == 143
    # The checkpoint the PS wrote (its shard) and the chief's index, read from the notebook image.
    out = read_from_notebook(
        pods, images, "tf1-log",
        "import tensorflow as tf; p = tf.train.latest_checkpoint('/log/checkpoints'); print(p); "
        "r = tf.train.load_checkpoint(p); print('STEP', r.get_tensor('global_step'), "
        "'W', r.get_tensor('w').ravel().round(3).tolist())")
    assert "/log/checkpoints/model-40" in out and "STEP 40" in out, out


def test_exit_codes_through_pid_1(images, pods):
    """Script broken (3, never retried), script raised (1), SIGKILL (137) and SIGTERM (143)."""
    cases = {
        # the spec refuses a script that does not compile: this one is broken in the ConfigMap
        "syntax": ("x = 1\n", 3),
        # installed where the notebook runs (the launch check passes), absent from the task image
        "imports": ("import playwright\n", 3),
        "raises": ("raise RuntimeError('boom')\n", 1),
        "killed": ("import time\nprint('SLEEPING', flush=True)\ntime.sleep(600)\n", 137),
        "termed": ("import time\nprint('SLEEPING', flush=True)\ntime.sleep(600)\n", 143),
    }
    plans = {}
    for name, (script, _) in cases.items():
        objects = render(name=name, workers=1, script=script, image=images["task"])
        if name == "syntax":
            next(o for o in objects if o["kind"] == "ConfigMap")["data"]["script.py"] = "def broken(:\n"
        (plan,) = pods.plans(objects)
        pods.start(plan)
        plans[name] = plan
    for name, signal in (("killed", "KILL"), ("termed", "TERM")):
        pods.wait_ready(plans[name])
        pods.kill(plans[name].container, signal)
    got = {name: pods.wait_exit(p.container, timeout=300) for name, p in plans.items()}
    assert got == {name: code for name, (_, code) in cases.items()}, {
        n: pods.logs(p.container)[-1500:] for n, p in plans.items()}
    from tfk8s_magics.lifecycle import EXIT_SCRIPT_BROKEN

    assert got["syntax"] == got["imports"] == EXIT_SCRIPT_BROKEN


def test_notebook_image_serves_jupyterlab_with_the_extension(images, pods):
    from tests.test_hub_e2e import KernelClient
    from tfk8s_magics.ports import free_port

    port, token = free_port(), secrets.token_hex(16)
    name = f"{pods.prefix}-notebook"
    pods.run("run", "--detach", "--name", name, "--label", f"tfk8s.test-run={pods.prefix}",
             *build_flags(), "--publish", f"127.0.0.1:{port}:8888", images["notebook"],
             "jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser",
             f"--IdentityProvider.token={token}")
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while True:
        try:
            if requests.get(url + "api/status", params={"token": token}, timeout=5).ok:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, pods.logs(name)[-3000:]
        time.sleep(0.5)
    assert requests.get(url + "lab", params={"token": token}, timeout=30).status_code == 200
    kernel = KernelClient(url, token)
    try:
        outputs, reply = kernel.execute(
            "%tfcluster list\nimport tfk8s_magics; print('MAGIC', tfk8s_magics.__name__)")
    finally:
        kernel.ws.close()
    assert reply["status"] == "ok", outputs
    assert any("MAGIC tfk8s_magics" in o.get("text", "") for o in outputs), outputs


def build_flags() -> list[str]:
    """Ulimit flags every ``podman run`` needs on this machine."""
    from tests.containers.podman import build_images

    return build_images.run_flags()


COORDINATOR = '''
import time
import tensorflow as tf
import tfk8s_magics as tk

strategy = tk.connect("ig", "kubernetes", timeout=300)
print("CONNECTED", type(strategy).__name__, flush=True)
with strategy.scope():
    counter = tf.Variable(0.0)
    weights = tf.Variable(tf.zeros([4]))
print("DEVICES", counter.device, weights.device, flush=True)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)


@tf.function
def step():
    counter.assign_add(1.0)
    weights.assign_add(tf.ones([4]))
    return tf.constant(1)


first = coordinator.schedule(step)
first.fetch()
print("FIRST_STEP", time.time(), flush=True)
results = [first] + [coordinator.schedule(step) for _ in range(11)]
coordinator.join()
print("RESULTS", [int(r.fetch()) for r in results], "COUNTER", counter.numpy(), flush=True)
print("STOPPED", tk.get("ig", "kubernetes").stop().phase, flush=True)
'''


def test_in_graph_coordinator_in_the_notebook_container(images, pods, make_kube, tmp_path):
    """The backend launches against the API double; its pods run as task containers (the podman
    kubelet); the notebook image's container connects with ``tk.connect``, trains and stops them."""
    from tests.containers.kubelet import PodmanKubelet
    from tfk8s_magics.backends.kubernetes.rbac import backend_role

    kube = make_kube()
    kube.create_namespace(NAMESPACE)
    kube.set_role(backend_role(NAMESPACE), NAMESPACE, service_account="jupyter")
    kubelet = PodmanKubelet(kube, pods, NAMESPACE)
    backend = KubernetesBackend(namespace=NAMESPACE, api_client=kube.api_client, user="alice",
                                storage_class="standard", image=images["task"])
    try:
        t0 = time.time()
        backend.launch(ClusterSpec(name="ig", mode="in-graph", ps=1, workers=2), detach=True)

        def running():
            assert not kubelet.errors, kubelet.errors
            got = kube.list_objects("pods", NAMESPACE)
            return len(got) == 3 and all((p.get("status") or {}).get("phase") == "Running" for p in got)

        kube.wait_for(running, timeout=400, interval=0.5, message="3 task containers ready")
        assert not kubelet.errors, kubelet.errors
        # the pods as JobSet names them (by the double's stand-in), read while they exist
        names = [kube.jobsets.pod_name(NAMESPACE, "ig", role, i)
                 for role, i in (("ps", 0), ("worker", 0), ("worker", 1))]
        assert sorted(kubelet.plans) == sorted(names)
        hosts = []
        for plan in kubelet.plans.values():
            ip = pods.run("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                          plan.container).stdout.strip()
            (fqdn,) = plan.dns_names
            # the TF_CONFIG names (…svc) and the fully qualified ones resolve to the task's container
            hosts += ["--add-host", f"{fqdn.removesuffix('.cluster.local')}:{ip}",
                      "--add-host", f"{fqdn}:{ip}"]
        config = tmp_path / "kube" / "config"
        config.parent.mkdir()
        config.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "double", "cluster": {"server": kube.url}}],
            "users": [{"name": "jupyter", "user": {}}],
            "contexts": [{"name": "lab", "context": {"cluster": "double", "user": "jupyter",
                                                    "namespace": NAMESPACE}}]}))
        config.chmod(0o644)
        config.parent.chmod(0o755)
        # host network: the API double listens on the host's 127.0.0.1 only
        r = pods.run("run", "--rm", "--network", "host", *hosts, *build_flags(),
                     "--label", f"tfk8s.test-run={pods.prefix}",
                     "-v", f"{config.parent}:/etc/tfk8s-kube:ro",
                     "--env", "KUBECONFIG=/etc/tfk8s-kube/config",
                     "--env", f"TFK8S_NAMESPACE={NAMESPACE}", "--env", "TFK8S_POD_IP=127.0.0.1",
                     images["notebook"], "python", "-c", COORDINATOR, check=False, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-5000:]
        assert "CONNECTED ParameterServerStrategy" in out
        devices = re.search(r"^DEVICES (\S+) (\S+)$", out, re.M).groups()
        assert all("/job:ps/" in d for d in devices), devices
        assert f"RESULTS {[1] * 12} COUNTER 12.0" in out, out[-3000:]
        assert "STOPPED" in out
        first = float(re.search(r"^FIRST_STEP (\S+)$", out, re.M).group(1))
        record("in_graph", {"launch_to_first_step_s": round(first - t0, 1)})
        # stop deleted the JobSet and with it its pods; each container got the kubelet's
        # SIGTERM and reported it as 143
        codes = kubelet.wait_stopped(names)
        assert codes == dict.fromkeys(names, 143)
    finally:
        backend.close()
        kubelet.close()

