"""An admin's first day on the production-shaped test cluster, then a user's first hour there
(issue 33's walk; markers ``k8s`` and ``admin_walk``).

Every step an administrator takes is a snippet of ``docs/admins/install.md``, read from the page and
run as written, the test's names in place of the examples' (:data:`PLACES`):

1. the images are pushed to the cluster's registry (distribution with htpasswd and TLS of the
   cluster CA, ``devcluster/registry.py``), the pull Secret, the TLS Secret, the OIDC client's
   Secret and the provider's CA are made with the page's ``kubectl`` lines, and ``helm install``
   runs with ONE values file: the page's ``lab.yaml`` (registry and pull Secret, an Ingress with a
   TLS host, the ``glusterfs`` class), its OIDC block and its private-provider block;
2. a real Chromium signs in over HTTPS through Traefik (``devcluster/ingress.py``) and Dex
   (``devcluster/identity.py``, on its own address of the node bridge, which the hub reaches through
   the ``networkPolicy.hubEgress`` rule under Cilium);
3. the notebook starts on a real node, pulling its image from the registry with the pull Secret;
4. the user runs the README's headline cell: its logs stream into the page while it runs,
   TensorBoard through the hub shows its scalars, and a checkpoint a task wrote on its
   Gluster-backed ``/log`` is read by a pod on the other node;
5. the idle server is culled; the home volume and its files survive;
6. ``helm uninstall`` leaves the homes (and the clusters' records and logs) and nothing running.

What the page does not cover, and the test adds: the images carry a label of the walk's own (an
image id no other test imports: the kubelet keeps the ids pulled with credentials, KEP-2535), the
proxy is this project's stand-in for the public configurable-http-proxy image (pushed too), the
cert-manager annotation is left out (the page's other way, a TLS Secret, is taken), and the
culler's timeout is short, the hub polling activity every 10 s.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import shlex
import ssl
import subprocess
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from test_helm import CHART, helm_binary

from devcluster import identity, ingress, node, registry, storage
from tests.realkube import podman_cluster, require_or_skip, wait_for
from tests.test_readme_examples import blocks

pytestmark = [pytest.mark.k8s, pytest.mark.admin_walk]

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "docs" / "admins" / "install.md"
HUB_NS, RELEASE, USER = "jhub", "lab", "alice"  # the page's namespace and release; a Dex user
USER_NS = f"{HUB_NS}-{USER}"
FULLNAME = f"{RELEASE}-tfk8s-lab"
BOUND = 600.0  # seconds any one wait may take on a loaded 2-core machine
PODMAN = ["podman", "--runtime", "/usr/sbin/runc"]
#: the page's example names -> the test cluster's (the walk's tag and the provider's address are
#: added at run time)
PLACES = {
    "registry.example.org": registry.NAME,
    "lab.example.org": ingress.HOST,
    "https://sso.example.org/dex": None,  # Dex's issuer
    "10.20.0.5": None,  # Dex's address
    '"0.1.0"': None,  # the walk's tag
    ":0.1.0": None,
}
CHECKPOINT = """%%tfcluster launch ckpt --workers 1
import os
import tensorflow as tf
step = tf.Variable(42)
where = os.path.join(os.environ["TFK8S_LOG_DIR"], "ckpt", "model")
os.makedirs(os.path.dirname(where), exist_ok=True)
print("saved", tf.train.Checkpoint(step=step).save(where))
"""
#: read by a pod on the other node from the Gluster-backed claims: the checkpoint, the home's notebook
READER = r"""
import os, tensorflow as tf
step = tf.Variable(0)
tf.train.Checkpoint(step=step).restore(tf.train.latest_checkpoint("/log/ckpt")).assert_consumed()
print("step", int(step.numpy()))
print("home", sorted(os.listdir("/mnt/home")))
"""
FETCH = """async (url) => {
  const r = await fetch(url);
  return [r.status, await r.text()];
}"""
PUT = """async ([url, body]) => {
  const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || "";
  const r = await fetch(url, {method: "PUT", body, headers: {"Content-Type": "application/json",
                                                              "X-XSRFToken": decodeURIComponent(xsrf)}});
  return r.status;
}"""


# -- the page's snippets ------------------------------------------------------------------------


def _snippets(places: dict[str, str]) -> dict[str, object]:
    """install.md's snippets the walk runs, with ``places`` substituted: the values blocks (YAML)
    and the commands (argv), by what each is for."""
    text = INSTALL.read_text()
    for example, ours in places.items():
        text = text.replace(example, ours)
    yamls, shells = blocks(text, "yaml"), blocks(text, "bash")

    def one(found: list[str], what: str) -> str:
        assert len(found) == 1, f"install.md has {len(found)} blocks for {what}"
        return found[0]

    def command(block: str, start: str) -> list[str]:
        lines = block.replace("\\\n", " ").splitlines()  # a command continued with "\" is one line
        (line,) = [ln for ln in lines if ln.startswith(start)]
        return shlex.split(line)

    pull = one([b for b in shells if "create secret docker-registry" in b], "the pull Secret")
    return {
        "lab.yaml": yaml.safe_load(one([y for y in yamls if "imagePullSecrets" in y], "lab.yaml")),
        "oidc": yaml.safe_load(one([y for y in yamls if "GenericOAuthenticator" in y], "OIDC")),
        "private": yaml.safe_load(one([y for y in yamls if "hubEgress" in y], "a private provider")),
        "namespace": command(pull, "kubectl create namespace"),
        "pull_secret": command(pull, "kubectl -n"),
        "tls_secret": shlex.split(re.search(r"`(kubectl -n \S+ create secret tls [^`]+)`", text).group(1)),
        "oauth_secret": command(one([b for b in shells if "lab-oauth" in b], "the OIDC Secret"), "kubectl"),
        "ca_configmap": command(one([b for b in shells if "create configmap" in b], "the CA"), "kubectl"),
        "install": command(one([b for b in shells if "helm install" in b], "helm install"), "helm install"),
        "uninstall": command(one([b for b in shells if "helm uninstall" in b], "helm uninstall"), "helm"),
    }


def _merge(into: dict, more: dict) -> dict:
    """``more`` added to ``into`` as the page says: nested keys merge, ``hub.extraConfig`` lines
    are appended."""
    out = copy.deepcopy(into)
    for k, v in more.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        elif k == "extraConfig" and isinstance(out.get(k), str):
            out[k] = out[k].rstrip("\n") + "\n" + v
        else:
            out[k] = copy.deepcopy(v)
    return out


def test_the_pages_snippets_make_one_values_file_with_every_production_part():
    """Runs without a cluster: the page's blocks are found and merge as the walk merges them."""
    got = _snippets({"registry.example.org": registry.NAME, "lab.example.org": ingress.HOST})
    values = _merge(_merge(got["lab.yaml"], got["oidc"]), got["private"])
    assert values["imagePullSecrets"] == ["regcred"]
    assert values["ingress"]["tls"] == [{"hosts": [ingress.HOST], "secretName": "lab-tls"}]
    assert values["lab"]["storage_class"] == storage.CLASS
    assert values["auth"]["class"] == "oauthenticator.generic.GenericOAuthenticator"
    config = values["hub"]["extraConfig"]
    assert f'client_id = "{identity.CLIENT_ID}"' in config  # the client Dex knows
    assert config.rstrip().endswith(
        'c.OAuthenticator.http_request_kwargs = {"ca_certs": "/etc/sso-ca/ca.crt"}'
    )
    assert values["hub"]["extraVolumeMounts"] == [
        {"name": "sso-ca", "mountPath": "/etc/sso-ca", "readOnly": True}
    ]
    assert got["pull_secret"][:6] == ["kubectl", "-n", "jhub", "create", "secret", "docker-registry"]
    assert got["install"] == ["helm", "install", "lab", "helm/tfk8s-lab", "-n", "jhub", "-f", "lab.yaml"]
    assert got["uninstall"] == ["helm", "uninstall", "lab", "-n", "jhub"]


# -- the cluster and the install ----------------------------------------------------------------


def _spki(pem: bytes) -> str:
    """Chromium's pin of a certificate: base64 of the SHA-256 of its public key's SPKI."""
    key = x509.load_pem_x509_certificate(pem).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def _push(reg, local: str, repository: str, label: str, tmp: Path) -> str:
    """``local`` with the walk's label, pushed as ``repository``; the name nodes pull it by."""
    ctx = tmp / repository.replace("/", "_").replace(":", "_")
    ctx.mkdir()
    (ctx / "Containerfile").write_text(f"FROM {local}\nLABEL tfk8s.walk={label}\n")
    tagged = f"localhost/tfk8s-walk/{repository}"
    subprocess.run([*PODMAN, "build", "-q", "-t", tagged, str(ctx)], check=True, capture_output=True)
    try:
        return registry.podman_push(reg, tagged, repository)
    finally:
        subprocess.run([*PODMAN, "rmi", tagged], capture_output=True)


def _kubectl(cluster, argv: list[str]) -> None:
    assert argv[0] == "kubectl", argv
    r = cluster.kubectl(*argv[1:], check=False)
    assert r.returncode == 0, f"{shlex.join(argv[:6])}...: {r.stderr.strip()}"


import test_containers  # noqa: E402 - after the fixtures' imports, as test_kube_hub does

images = test_containers.images  # the lab's images, built once per session from this tree


@pytest.fixture(scope="module")
def parts(realkube):
    """The production-shaped cluster: two real nodes, the registry, Traefik, Dex, the Gluster class."""
    cluster = podman_cluster()
    reg, ing, ident = registry.load(cluster), ingress.load(cluster), identity.load(cluster)
    missing = [
        what
        for what, ok in (
            ("two real nodes", node.running(cluster) and len(node.layouts(cluster)) >= 2),
            ("the registry", reg is not None and cluster.procs.alive(registry.PROCESS)),
            ("the Ingress controller", ing is not None and cluster.procs.alive(ingress.PROCESS)),
            ("Dex", ident is not None and cluster.procs.alive(identity.PROCESS)),
        )
        if not ok
    ]
    if missing:
        require_or_skip(
            f"the devcluster in {cluster.root} lacks {', '.join(missing)}: "
            "start it with scripts/kube up --pods"
        )
    from kubernetes import client

    classes = {c.metadata.name for c in client.StorageV1Api(realkube.admin).list_storage_class().items}
    assert storage.CLASS in classes, classes
    return cluster, reg, ing, ident


@pytest.fixture(scope="module")
def installed(realkube, parts, images, request, tmp_path_factory):
    """The images pushed, the page's Secrets made, ``helm install`` run with one values file."""
    from test_container_hub import base_image, proxy_standin

    from tests.containers.podman import PodmanRun

    cluster, reg, ing, ident = parts
    kube = realkube
    tmp = tmp_path_factory.mktemp("walk")
    kube.clear_namespaces(USER_NS, HUB_NS)  # a previous run's leftovers
    tag = f"0.1.0-walk{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    pods = PodmanRun(f"tfk8s-walk-{uuid.uuid4().hex[:6]}", tmp / "podman")
    try:
        chp = proxy_standin(pods, base_image(), tmp)
    finally:
        pods.cleanup()
    pushed = {
        name: _push(reg, local, f"tfk8s/{name}:{tag}", tag, tmp)
        for name, local in (
            ("hub", images["hub"]),
            ("notebook", images["notebook"]),
            ("tensorflow-task", images["task"]),
            ("configurable-http-proxy", chp),
        )
    }
    print(f"images relabelled and pushed to the registry in {time.monotonic() - t0:.0f} s")
    sso_ip = urllib.parse.urlsplit(ident.issuer).hostname
    got = _snippets(
        {
            **PLACES,
            "https://sso.example.org/dex": ident.issuer,
            "10.20.0.5": sso_ip,
            '"0.1.0"': f'"{tag}"',
            ":0.1.0": f":{tag}",
        }
    )
    values = _merge(_merge(got["lab.yaml"], got["oidc"]), got["private"])
    assert values["hub"]["image"] == {"repository": f"{registry.NAME}/tfk8s/hub", "tag": tag}
    assert values["lab"]["notebook_image"] == pushed["notebook"], (values["lab"], pushed)
    assert values["lab"]["task_image"] == pushed["tensorflow-task"]
    # what the page leaves to the admin's cluster (see the module's docstring)
    del values["ingress"]["annotations"]  # no cert-manager here: the TLS Secret is made below
    repository, _, proxy_tag = pushed["configurable-http-proxy"].rpartition(":")
    values["proxy"] = {"image": {"repository": repository, "tag": proxy_tag}}
    values["cull"] = {"timeout": 60, "every": 10}
    values["hub"]["extraConfig"] += "c.JupyterHub.last_activity_interval = 10\n"
    (tmp / "lab.yaml").write_text(yaml.safe_dump(values))

    # the page's commands, its file names in place
    crt, key = _lab_certificate(cluster, ingress.HOST)
    (tmp / "sso-ca.crt").write_bytes(ident.ca.read_bytes())
    files = {"lab.crt": str(crt), "lab.key": str(key), "sso-ca.crt": str(tmp / "sso-ca.crt")}

    def placed(argv: list[str]) -> list[str]:
        out = []
        for a in argv:
            for name, path in files.items():
                a = re.sub(rf"(?<=[=]){re.escape(name)}$", path, a)
            out.append(a)
        return out

    _kubectl(cluster, got["namespace"])
    pull = [
        a.replace("--docker-username=lab", f"--docker-username={registry.USER}").replace(
            "--docker-password=...", f"--docker-password={reg.password}"
        )
        for a in got["pull_secret"]
    ]
    _kubectl(cluster, pull)
    _kubectl(cluster, placed(got["tls_secret"]))
    _kubectl(
        cluster,
        [a.replace("client-secret=...", f"client-secret={ident.client_secret}") for a in got["oauth_secret"]],
    )
    _kubectl(cluster, placed(got["ca_configmap"]))

    helm = helm_binary(request, tmp_path_factory)
    install = got["install"]
    argv = [str(helm), "--kubeconfig", kube.kubeconfig, *install[1:]]
    argv[argv.index("helm/tfk8s-lab")] = str(CHART)
    argv[argv.index("lab.yaml")] = str(tmp / "lab.yaml")
    started = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND)
    if r.returncode:
        pods_now = cluster.kubectl("get", "pods,events", "-n", HUB_NS, "-o", "wide", check=False).stdout
        pytest.fail(f"helm install failed: {r.stderr[-2000:]}\n{pods_now[-4000:]}")
    dex_pem = ssl.get_server_certificate((sso_ip, urllib.parse.urlsplit(ident.issuer).port)).encode()
    state = {
        "kube": kube,
        "cluster": cluster,
        "ing": ing,
        "ident": ident,
        "pushed": pushed,
        "tag": tag,
        "started": started,
        "helm": [str(helm), "--kubeconfig", kube.kubeconfig],
        "got": got,
        "pins": [_spki(crt.read_bytes()), _spki(dex_pem)],
        "tmp": tmp,
    }
    try:
        yield state
    finally:
        subprocess.run(
            [str(helm), "--kubeconfig", kube.kubeconfig, "uninstall", RELEASE, "-n", HUB_NS, "--no-hooks"],
            capture_output=True,
            timeout=BOUND,
        )
        for ns in (USER_NS, HUB_NS):
            if kube.namespace_exists(ns):
                kube.core.delete_namespace(ns)
                kube.leaving.append(ns)
        for n in node.layouts(cluster):  # the nodes' image stores outlive the cluster
            for image in pushed.values():
                node.remove_image(n, image)


def _lab_certificate(cluster, host: str) -> tuple[Path, Path]:
    """A certificate for ``host`` signed by the cluster CA (the admin's own TLS Secret's)."""
    from devcluster.pki import CA

    return CA(cluster.pki).issue("walk-lab", host, dns=(host,), server=True)


# -- the user's hour ----------------------------------------------------------------------------


def _headline_cell() -> str:
    """The README's headline launch cell, as written."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- headline -->", 1)[1].split("<!-- /headline -->", 1)[0]
    (code,) = [b for b in blocks(block, "python") if "%%tfcluster launch" in b]
    return "%%tfcluster launch" + code.split("%%tfcluster launch", 1)[1].split("\n\n%tfcluster", 1)[0]


def _pulls(kube, ns: str, image: str) -> list[str]:
    events = kube.core.list_namespaced_event(ns).items
    return [e.message for e in events if e.reason == "Pulling" and image in (e.message or "")]


def test_a_user_signs_in_through_dex_over_https_and_runs_the_headline(installed):
    from tests.browserlab import chromium, run_cell, shot, wait

    kube, ing, ident, pushed = installed["kube"], installed["ing"], installed["ident"], installed["pushed"]
    core = kube.core
    base = f"https://{ingress.HOST}"
    args = (
        f"--host-resolver-rules=MAP {ingress.HOST} {ing.ip}",
        "--no-proxy-server",
        f"--ignore-certificate-errors-spki-list={','.join(installed['pins'])}",
    )
    times: dict[str, float] = {}
    with chromium(installed["tmp"] / "chromium-profile", args=args) as page:
        # 2. HTTPS through the Ingress; sign in at Dex
        def login_page() -> bool:
            try:
                return page.goto(f"{base}/hub/login", timeout=15_000).status == 200
            except Exception:  # noqa: BLE001 - not routed yet (Traefik applies the Ingress once its pods are Ready)
                return False

        wait(login_page, BOUND, "the hub's login page through the Ingress", page, "walk-")
        times["login page"] = time.monotonic() - installed["started"]
        page.locator("a", has_text="Sign in with").first.click()
        page.wait_for_url(f"{ident.issuer}/**", timeout=60_000)
        page.fill("input[name=login]", identity.USERS[USER])
        page.fill("input[name=password]", ident.passwords[USER])
        page.locator("button[type=submit]").click()
        # 3. the spawn: the namespace, the pull, JupyterLab
        page.wait_for_url(f"{base}/user/{USER}/lab**", timeout=int(BOUND * 1000))
        times["JupyterLab"] = time.monotonic() - installed["started"]
        (pod,) = kube.pods(USER_NS, "component=singleuser-server")
        assert pod.spec.node_name in node.NODE_NAMES, pod.spec.node_name
        assert pod.spec.containers[0].image == pushed["notebook"]
        assert [s.name for s in pod.spec.image_pull_secrets] == ["regcred"]
        assert _pulls(kube, USER_NS, pushed["notebook"]), "the node did not pull the notebook image"
        assert (
            core.read_namespaced_persistent_volume_claim(f"home-{USER}", USER_NS).spec.storage_class_name
            == storage.CLASS
        )
        sa = core.read_namespaced_service_account("default", USER_NS)
        assert [s.name for s in sa.image_pull_secrets or []] == ["regcred"]  # task pods pull with it

        # 4. the user's notebook: the headline, a checkpoint, TensorBoard
        cells = [_headline_cell(), CHECKPOINT]
        nb = {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": f"c{i}",
                    "metadata": {},
                    "outputs": [],
                    "source": src,
                }
                for i, src in enumerate(cells)
            ],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        status = page.evaluate(
            PUT,
            [
                f"/user/{USER}/api/contents/walk.ipynb",
                json.dumps({"type": "notebook", "format": "json", "content": nb}),
            ],
        )
        assert status in (200, 201), status
        page.goto(f"{base}/user/{USER}/lab/tree/walk.ipynb?reset")
        page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
        wait(
            lambda: "Idle" in page.locator("#jp-main-statusbar").inner_text(),
            300,
            "the kernel",
            page,
            "walk-",
        )
        code = page.locator(".jp-Notebook .jp-CodeCell")
        run_cell(page, code.nth(0))
        dash = code.nth(0).locator(".tfk8s-dashboard")
        dash.wait_for(timeout=120_000)
        header = dash.locator(".tfk8s-header").first
        log = dash.locator(".tfk8s-log").first
        seen: dict[str, str] = {}

        def first_line() -> bool:
            if (log.text_content() or "").strip():
                seen["phase"] = header.get_attribute("data-phase") or ""
                return True
            return False

        wait(first_line, BOUND, "the first log line in the page", page, "walk-")
        times["first log line"] = time.monotonic() - installed["started"]
        # streamed while the cluster runs (its first task's lines, the others may still start),
        # not shown once it has ended
        assert seen["phase"] in ("starting", "running"), seen
        task_images: set[str] = set()

        def succeeded() -> bool:
            task_images.update(
                p.spec.containers[0].image for p in kube.pods(USER_NS, "tfk8s.io/cluster=mnist")
            )
            return header.get_attribute("data-phase") == "succeeded"

        wait(succeeded, BOUND, "the headline to succeed", page, "walk-")
        text = "\n".join(dash.locator(".tfk8s-log").all_text_contents())
        assert "Epoch 2/2" in text, text[-2000:]
        assert task_images == {pushed["tensorflow-task"]}, task_images  # pulled from the registry too

        # TensorBoard, through the hub and the notebook server, shows the run's scalars
        dash.locator("button.tfk8s-tb").click()
        frame = dash.locator(".tfk8s-tensorboard iframe")
        wait(lambda: frame.count() == 1, BOUND, "the TensorBoard tab", page, "walk-")
        src = frame.get_attribute("src")
        assert src.startswith(f"/user/{USER}/"), src  # behind the hub's login

        def loss():
            code_, body = page.evaluate(FETCH, f"{src}data/plugin/scalars/scalars?run=progress&tag=loss")
            return code_ == 200 and json.loads(body)

        points = wait(loss, 180, "the loss in TensorBoard", page, "walk-")
        assert [int(s) for _, s, _ in points][-1] == 8, points
        shot(page, "admin-walk-headline.png")

        # a checkpoint on the Gluster-backed /log
        run_cell(page, code.nth(1))
        ck = code.nth(1).locator(".tfk8s-dashboard")
        ck.wait_for(timeout=120_000)
        writers: set[str] = set()

        def saved() -> bool:
            writers.update(
                p.spec.node_name for p in kube.pods(USER_NS, "tfk8s.io/cluster=ckpt") if p.spec.node_name
            )
            return ck.locator(".tfk8s-header").first.get_attribute("data-phase") == "succeeded"

        wait(saved, BOUND, "the checkpoint to be saved", page, "walk-")
        assert "saved /log/ckpt/model-1" in "\n".join(ck.locator(".tfk8s-log").all_text_contents())
        assert len(writers) == 1, writers
        page.keyboard.press("Control+s")
        wait(lambda: not page.locator(".lm-TabBar-tab.jp-mod-dirty").count(), 60, "the notebook saved", page)
    culled_from = time.monotonic()  # the page is closed: nothing uses the server any more

    # 5. the idle server is culled; the home stays
    wait_for(lambda: not kube.pods(USER_NS, "component=singleuser-server"), BOUND, 2, "the culler to stop it")
    culled = time.monotonic() - culled_from
    (hub_pod,) = kube.pods(HUB_NS, "app.kubernetes.io/component=hub")
    hub_log = core.read_namespaced_pod_log(hub_pod.metadata.name, HUB_NS)
    assert re.search(rf"Culling server {USER}\b", hub_log), hub_log[-3000:]
    assert core.read_namespaced_persistent_volume_claim(f"home-{USER}", USER_NS).status.phase == "Bound"

    # a pod on the other node reads the checkpoint and the home's notebook from Gluster
    from tests.test_k8s_pods import _restricted_pod

    (writer,) = writers
    other = next(n for n in node.NODE_NAMES if n != writer)
    reader = _restricted_pod("reader", pushed["tensorflow-task"], ["python", "-c", READER])
    reader["metadata"]["labels"] = {"app": "walk-reader"}  # not a notebook server's
    spec = reader["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": other}
    spec["securityContext"]["fsGroup"] = 100
    spec["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    spec["containers"][0]["volumeMounts"] = [
        {"name": "log", "mountPath": "/log", "readOnly": True},
        {"name": "home", "mountPath": "/mnt/home", "readOnly": True},
    ]
    spec["volumes"] = [
        {"name": "log", "persistentVolumeClaim": {"claimName": "ckpt-log"}},
        {"name": "home", "persistentVolumeClaim": {"claimName": f"home-{USER}"}},
    ]
    core.create_namespaced_pod(USER_NS, reader)  # pulls with the default ServiceAccount's Secret

    def ended():
        p = core.read_namespaced_pod("reader", USER_NS)
        return p.status.phase if p.status.phase in ("Succeeded", "Failed") else None

    phase = wait_for(ended, BOUND, 2, "the reader on the other node")
    out = core.read_namespaced_pod_log("reader", USER_NS)
    why = [
        (c.state.terminated.reason, c.state.terminated.exit_code, c.state.terminated.message)
        for c in core.read_namespaced_pod("reader", USER_NS).status.container_statuses
        if c.state.terminated
    ]
    assert phase == "Succeeded" and "step 42" in out, (out[-2000:], why)
    assert "walk.ipynb" in out.split("home", 1)[1], out
    core.delete_namespaced_pod("reader", USER_NS, grace_period_seconds=0)
    wait_for(
        lambda: not [p for p in kube.pods(USER_NS) if p.metadata.name == "reader"],
        BOUND,
        1,
        "the reader to go",
    )
    print(
        "admin walk, from helm install: "
        + "; ".join(f"{k} {v:.0f} s" for k, v in times.items())
        + f"; culled {culled:.0f} s after the page closed"
    )


def test_helm_uninstall_leaves_the_homes_and_nothing_running(installed):
    """Runs after the walk (file order): the page's uninstall, then what its table says stays."""
    from kubernetes import client

    kube, cluster = installed["kube"], installed["cluster"]
    core = kube.core
    argv = [*installed["helm"], *installed["got"]["uninstall"][1:], "--wait", "--timeout", f"{int(BOUND)}s"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND + 60)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not kube.pods(HUB_NS), BOUND, 1, "the hub's pods to go")
    left = cluster.kubectl(
        "get", "deployments,services,ingresses,networkpolicies,rolebindings", "-n", HUB_NS, "-o", "name"
    ).stdout.split()
    assert not left, left
    # the user's namespace: nothing runs, no access is left, the home and the clusters' logs stay
    wait_for(lambda: not kube.pods(USER_NS), BOUND, 1, "every pod of the user to end")
    jobsets = client.CustomObjectsApi(kube.admin).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", USER_NS, "jobsets"
    )["items"]
    assert not jobsets, [j["metadata"]["name"] for j in jobsets]
    bindings = client.RbacAuthorizationV1Api(kube.admin).list_namespaced_role_binding(USER_NS).items
    assert not bindings, [b.metadata.name for b in bindings]
    claims = {
        c.metadata.name: c.status.phase for c in core.list_namespaced_persistent_volume_claim(USER_NS).items
    }
    assert claims.get(f"home-{USER}") == "Bound" and claims.get("ckpt-log") == "Bound", claims
