"""Rendering needs no cluster; settings are read lazily; the pod's log copy works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from tfk8s_magics.backends import get_backend
from tfk8s_magics.backends.kubernetes import KubernetesBackend, render_yaml
from tfk8s_magics.backends.kubernetes.settings import K8sSettings, settings_from_env
from tfk8s_magics.spec import ClusterSpec

SPEC = ClusterSpec(name="r", ps=1, workers=1, script="print(1)\n")


def test_render_needs_no_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("TFK8S_NAMESPACE", "team")
    monkeypatch.setenv("TFK8S_IMAGE", "registry.local/tf:1")
    monkeypatch.setenv("JUPYTERHUB_USER", "carol")
    backend = get_backend("kubernetes")
    assert isinstance(backend, KubernetesBackend)
    docs = backend.render(SPEC, tensorboard=True)
    assert [d["kind"] for d in docs] == [
        "ConfigMap", "PersistentVolumeClaim", "PersistentVolumeClaim",
        "Deployment", "Service", "JobSet"]
    assert {d["metadata"]["namespace"] for d in docs} == {"team"}
    template = docs[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["spec"]["containers"][0]["image"] == "registry.local/tf:1"
    assert docs[0]["metadata"]["labels"]["tfk8s.io/user"] == "carol"
    assert backend._api is None  # nothing connected
    text = backend.render_yaml(SPEC)
    assert list(yaml.safe_load_all(text)) == backend.render(SPEC)


def test_module_level_render_yaml():
    text = render_yaml(SPEC, K8sSettings(namespace="n", user="u"))
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(text)] == [
        "r", "r-data", "r-log", "r"]


def test_constructor_reads_nothing(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("settings read in __init__")

    monkeypatch.setattr("tfk8s_magics.backends.kubernetes.backend.settings_from_env", boom)
    KubernetesBackend(namespace="x")


def test_settings_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TFK8S_NAMESPACE", "from-env")
    monkeypatch.setenv("TFK8S_STORAGE_CLASS", "nfs")
    monkeypatch.setattr("tfk8s_magics.backends.kubernetes.settings.NAMESPACE_FILE",
                        str(tmp_path / "none"))
    s = settings_from_env()
    assert (s.namespace, s.storage_class) == ("from-env", "nfs")
    assert settings_from_env(namespace="given", storage_class="gluster").namespace == "given"
    nsfile = tmp_path / "namespace"
    nsfile.write_text("in-pod\n")
    from tfk8s_magics.backends.kubernetes.settings import in_pod_namespace

    assert in_pod_namespace(str(nsfile)) == "in-pod"
    monkeypatch.delenv("TFK8S_STORAGE_CLASS")
    assert settings_from_env(namespace="n").storage_class == "glusterfs"


def test_logcopy_tees_output_and_passes_the_exit_code(tmp_path):
    copy = tmp_path / "tasks" / "worker-0.log"
    child = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    proc = subprocess.run(
        [sys.executable, "-m", "tfk8s_magics.backends.kubernetes.logcopy", str(copy), "--",
         sys.executable, "-c", child],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 3
    assert proc.stdout.splitlines() == ["out", "err"]
    kept = copy.read_text().splitlines()
    assert kept[0].startswith("--- tfk8s:") and kept[1:] == ["out", "err"]


def test_logcopy_reports_a_signal_death_as_128_plus_n(tmp_path):
    child = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.run(
        [sys.executable, "-m", "tfk8s_magics.backends.kubernetes.logcopy",
         str(tmp_path / "x.log"), "--", sys.executable, "-c", child],
        capture_output=True, timeout=30,
    )
    assert proc.returncode == 128 + 9  # what a container runtime reports for the task itself


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_logcopy_as_pid_1_exits_128_plus_n(tmp_path, sig):
    """As PID 1 of a PID namespace (a container's case) the kernel drops signals PID 1 has
    no handler for: logcopy must still exit 128 + N when its task dies of the forwarded signal."""
    ready = tmp_path / "ready"
    child = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    proc = subprocess.Popen(
        ["unshare", *([] if os.geteuid() == 0 else ["--user", "--map-root-user"]),
         "--pid", "--fork", "--kill-child", sys.executable, "-m",
         "tfk8s_magics.backends.kubernetes.logcopy", str(tmp_path / "x.log"), "--",
         sys.executable, "-c", child],
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the task never started"
            time.sleep(0.05)
        (pid1,) = psutil.Process(proc.pid).children()  # PID 1 inside the namespace
        pid1.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        proc.kill()
        proc.wait()
