"""The hub image runs the chart's hub as the rendered Deployment says, and /hub/health answers.

``helm template`` renders the chart; its hub and proxy Deployments run as podman
containers through ``tests/containers`` (command, args, env with the Secret's
values, uid/gid, fsGroup, read-only root, dropped capabilities, the ConfigMap's
``jupyterhub_config.py`` and ``values.json`` mounted where the pod mounts them,
``/tmp`` as an emptyDir, the hub-db claim as a podman volume, the Services' DNS
names).  No Kubernetes API is reachable here: KubeSpawner is configured, not used
(no spawn).  The proxy Deployment's image cannot be pulled (no registry): it runs
a stand-in with the same npm package, the one field changed.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import test_containers
import test_helm
from test_containers import record
from test_helm import render

# the shared fixtures (the images built once per session, a PodmanRun, the helm binary)
images, pods, helm = test_containers.images, test_containers.pods, test_helm.helm

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "lab-test"
# Accepted explicitly, and only here: no liveness probe runs (the readiness probe, the same
# GET /hub/health, does), no API token is mounted (no API server: KubeSpawner is configured,
# never called), no Service variables are set (the hub reads its peers by DNS name), and
# proxy-public (port 80 -> 8000) gets no name (a network alias cannot translate ports; nothing
# here uses it).
UNENFORCED = {"livenessProbe", "serviceAccountToken", "enableServiceLinks",
              "Service/lab-tfk8s-lab-proxy-public"}


def base_image() -> str:
    """The base image scripts/base-image makes (found, not rebuilt, once it exists)."""
    r = subprocess.run([str(REPO / "scripts" / "base-image")], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def proxy_standin(pods, base: str, tmp_path: Path) -> str:
    """Build (once per input) the stand-in for the chart's configurable-http-proxy image."""
    from tests.containers.podman import build_images

    node = shutil.which("node")
    assert node and (REPO / "node_modules" / "configurable-http-proxy").is_dir(), (
        "Node.js and node_modules (npm ci) are needed: run scripts/bootstrap")
    dockerfile = REPO / "tests" / "containers" / "proxy" / "Dockerfile"
    h = hashlib.sha256(base.encode() + dockerfile.read_bytes() + Path(node).read_bytes()
                       + (REPO / "package-lock.json").read_bytes()).hexdigest()[:12]
    ref = f"localhost/tfk8s/chp-standin:h-{h}"
    if pods.run("image", "exists", ref, check=False).returncode != 0:
        ctx = tmp_path / "proxy-context"
        shutil.copytree(REPO / "node_modules", ctx / "node_modules")
        shutil.copy2(node, ctx / "node")
        pods.run("build", *build_images.ulimits(), "--build-arg", f"BASE_IMAGE={base}",
                 "-f", str(dockerfile), "-t", ref, str(ctx), timeout=600)
    return ref


def chart_objects(helm, images, chp: str) -> list[dict]:
    """The chart rendered for the hub image just built; the proxy's image is the stand-in."""
    repo, tag = images["hub"].rsplit(":", 1)
    objects = render(helm, "--set", f"hub.image.repository={repo}", "--set", f"hub.image.tag={tag}",
                     namespace=NAMESPACE)
    for obj in objects:
        # helm install --namespace creates the chart's objects (which name none) in the release's
        # namespace: the one the rendered config's DNS names (…lab-test.svc) point into
        obj["metadata"].setdefault("namespace", NAMESPACE)
        if obj["kind"] == "Deployment" and obj["metadata"]["name"].endswith("-proxy"):
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            assert container["image"].endswith("configurable-http-proxy:5.2.0"), container["image"]
            container["image"] = chp  # the one field changed: the image cannot be pulled here
    return objects


def test_hub_image_starts_jupyterhub_with_the_charts_config(images, pods, helm, tmp_path):
    """The hub Deployment as rendered: JupyterHub starts with the chart's config (KubeSpawner),
    its readiness probe passes, GET /hub/health answers 200 and the hub registered with the proxy."""
    objects = chart_objects(helm, images, proxy_standin(pods, base_image(), tmp_path))
    plans = {p.pod.name.rsplit("-", 2)[-2]: p for p in pods.plans(objects, unenforced=UNENFORCED)}
    assert set(plans) == {"hub", "proxy"}, sorted(plans)
    hub, proxy = plans["hub"], plans["proxy"]
    # what the pod template says, as podman got it
    assert "--read-only" in hub.run_args and hub.uid == 1000 and hub.fs_group == 1000
    assert ["--cap-drop", "ALL"] == hub.run_args[hub.run_args.index("--cap-drop"):][:2]
    pods.start(proxy)
    pods.wait_ready(proxy)
    t0 = time.monotonic()
    pods.start(hub)
    pods.wait_ready(hub)  # the chart's own readiness probe: GET /hub/health, from inside the pod
    record("hub", {"podman_run_to_health_s": round(time.monotonic() - t0, 1)})
    hub_url = "http://lab-tfk8s-lab-hub:8081/hub"
    probe = (f"import urllib.request as u; r = u.urlopen('{hub_url}/health', timeout=10); print(r.status); "
             f"print(u.urlopen('{hub_url}/api', timeout=10).read().decode())")
    # asked from the proxy's container, by the hub Service's DNS name, as the proxy reaches it
    out = pods.run("exec", proxy.container, "python3", "-c", probe).stdout.splitlines()
    assert out[0] == "200" and '"version"' in out[1], out
    logs = pods.logs(hub.container)
    assert "Using Spawner: kubespawner.spawner.KubeSpawner" in logs, logs[-3000:]
    # the chart's config, as the ConfigMap mounts it, is what the hub read and acted on
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "lab-tfk8s-lab-hub"]
    for key in ("jupyterhub_config.py", "values.json"):
        inside = pods.run("exec", hub.container, "cat", f"/etc/jupyterhub/{key}").stdout
        assert inside == cm["data"][key], key
    assert "Using Authenticator: jupyterhub.authenticators.shared.SharedPasswordAuthenticator" in logs
    assert "Private Hub API connect url http://lab-tfk8s-lab-hub.lab-test.svc:8081/hub/" in logs, logs[-3000:]
    assert "Adding route for Hub: / => http://lab-tfk8s-lab-hub.lab-test.svc:8081" in logs, logs[-3000:]
    assert "Starting managed service jupyterhub-idle-culler" in logs, logs[-3000:]
