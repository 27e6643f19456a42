"""The test cluster's image registry: distribution's ``registry`` with htpasswd and TLS.

What a production cluster pulls its images from: a registry that wants credentials, reached over
HTTPS with a certificate the nodes trust. ``registry`` (distribution v3, built from its published
module and cached by version, :mod:`devcluster.build`) listens on 127.0.0.1 only, with

- a serving certificate signed by the cluster CA (:mod:`devcluster.pki`), naming
  :data:`NAME` and the address it listens on;
- htpasswd authentication: one user, a random password kept in ``<cluster>/registry/`` (0600),
  its bcrypt hash in the htpasswd file the registry reads;
- a filesystem store beside the cached binaries (``<cache>/registry-data``), so the lab's images
  are pushed once, not at every start.

Images are named ``registry.tfk8s.test/<repository>:<tag>`` (:data:`NAME`, a reserved test
domain no resolver answers): every node's containerd maps that name to the registry's address as
the nodes reach it (the host's end of the node bridge, which :mod:`devcluster.network` DNATs to
127.0.0.1 like the API server's port) and trusts the cluster CA for it through a ``hosts.toml``
(:func:`hosts_toml`) in the directory its ``config_path`` names (:func:`hosts_dir`), and
authenticates with the pod's image pull Secret (:func:`pull_secret`). The host pushes to
127.0.0.1 (:func:`podman_push`), with the CA and the credentials in files, never on a command line.

The pure builders (``config``, ``hosts_toml``, ``htpasswd_line``, ``docker_config``,
``pull_secret``) return data; :func:`up` performs them and waits for :func:`ready`.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from . import build
from .hostfiles import free_port, write_private
from .pki import CA
from .versions import cache_root

#: the name the cluster's images carry: ``registry.tfk8s.test/tfk8s/hub:0.1.0``
NAME = "registry.tfk8s.test"
USER = "tfk8s"
REALM = "tfk8s-devcluster registry"
PROCESS = "registry"


class RegistryError(RuntimeError):
    """The registry could not be started or used; the message says what failed and what to do."""


@dataclass(frozen=True)
class Registry:
    """A running (or configured) registry of one cluster directory."""

    root: Path  # <cluster>/registry
    address: str  # host:port it listens on
    ca: Path  # the cluster CA that signed its certificate
    node_ip: str | None = None  # the host's end of the node bridge, where real nodes reach it

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.address.rpartition(":")[2])

    @property
    def node_address(self) -> str:
        """Where the real nodes reach it: the host's end of the node bridge, DNATed to 127.0.0.1."""
        if self.node_ip is None:
            raise RegistryError("this registry was started for no real node (no node_ip)")
        return f"{self.node_ip}:{self.port}"

    @property
    def password_file(self) -> Path:
        """The user's password (0600)."""
        return self.root / "password"

    @property
    def password(self) -> str:
        """The user's password."""
        return self.password_file.read_text().strip()

    @property
    def htpasswd(self) -> Path:
        """The htpasswd file the registry reads (bcrypt)."""
        return self.root / "htpasswd"

    @property
    def cert_dir(self) -> Path:
        """A directory with the CA as ``ca.crt``: podman's and skopeo's ``--cert-dir``."""
        return self.root / "certs"

    @property
    def authfile(self) -> Path:
        """A containers-auth.json with the credentials for :attr:`address` (podman's ``--authfile``)."""
        return self.root / "auth.json"

    def image(self, repository: str) -> str:
        """The name nodes pull ``repository`` (``tfk8s/hub:0.1.0``) by."""
        return f"{NAME}/{repository}"

    def push_ref(self, repository: str) -> str:
        """The reference the host pushes ``repository`` to (the registry's own address)."""
        return f"{self.address}/{repository}"


# -- pure builders ------------------------------------------------------------------------------


def config(address: str, data: Path, cert: Path, key: Path, htpasswd: Path, secret: str) -> dict:
    """distribution's configuration: TLS, htpasswd, a filesystem store, nothing else listening."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(data)},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": address,
            "secret": secret,
            "tls": {"certificate": str(cert), "key": str(key)},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "auth": {"htpasswd": {"realm": REALM, "path": str(htpasswd)}},
    }


def htpasswd_line(user: str, password: str) -> str:
    """One htpasswd line with a bcrypt hash (the only scheme distribution accepts)."""
    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}\n"


def hosts_toml(address: str, ca: Path) -> str:
    """containerd's ``hosts.toml`` for :data:`NAME`: pull and resolve from ``address``, trusting ``ca``."""
    return (
        "# Written by devcluster/registry.py: where this cluster's images come from.\n"
        f"server = {json.dumps('https://' + address)}\n"
        f"ca = {json.dumps(str(ca))}\n"
        'capabilities = ["pull", "resolve"]\n'
    )


def docker_config(registry: str, user: str, password: str) -> dict:
    """A ``.dockerconfigjson`` (also containers-auth.json) holding ``user``'s credentials for ``registry``."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"auths": {registry: {"auth": auth}}}


def pull_secret(name: str, namespace: str, user: str, password: str) -> dict:
    """An image pull Secret (``kubernetes.io/dockerconfigjson``) for :data:`NAME`."""
    data = json.dumps(docker_config(NAME, user, password)).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(data).decode()},
    }


# -- performing ---------------------------------------------------------------------------------


def hosts_dir(cluster_root: Path) -> Path:
    """The directory a node's containerd reads ``hosts.toml`` files from (its ``config_path``)."""
    return cluster_root / "registry" / "hosts.d"


def data_dir() -> Path:
    """The registry's store, kept across clusters (pushing the lab's images takes minutes)."""
    return cache_root() / "registry-data"


def ready(address: str, ca: Path, user: str | None = None, password: str | None = None) -> int:
    """The status ``GET /v2/`` answers over TLS verified by ``ca`` (401 without credentials, 200 with)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    req = urllib.request.Request(f"https://{address}/v2/")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def load(cluster) -> Registry | None:
    """The registry of ``cluster`` as ``up`` recorded it, or None when none was started there."""
    try:
        rec = json.loads((cluster.root / "registry" / "registry.json").read_text())
    except (OSError, ValueError):
        return None
    return Registry(root=cluster.root / "registry", address=rec["address"], ca=cluster.pki / "ca.crt",
                    node_ip=rec.get("node_ip"))


def up(cluster, host: str = "127.0.0.1", node_ip: str | None = None, timeout: float = 60.0,
       log=print) -> Registry:
    """Start the registry of ``cluster`` (its process among the cluster's); return it once it answers.

    ``node_ip``: the address real nodes reach it at (named in its certificate and in the nodes'
    ``hosts.toml``); None for a registry only this host uses.
    """
    comp = build.ensure("registry")
    old = load(cluster)
    if old and cluster.procs.alive(PROCESS):
        if node_ip is None or old.node_ip == node_ip:
            return old
        # started for no node, or another slot's: its certificate does not name this address
        cluster.procs.stop(PROCESS)
    root = cluster.root / "registry"
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    reg = Registry(root=root, address=f"{host}:{free_port(host)}", ca=cluster.pki / "ca.crt",
                   node_ip=node_ip)
    ips = (host, node_ip) if node_ip else (host,)
    # one certificate per address set: the CA issues a stem once, and a slot's address must be in it
    stem = f"registry-{node_ip}" if node_ip else "registry"
    cert, key = CA(cluster.pki).issue(stem, NAME, dns=(NAME,), ips=ips, server=True)
    if not reg.password_file.exists():
        write_private(reg.password_file, secrets.token_urlsafe(24) + "\n")
    write_private(reg.htpasswd, htpasswd_line(USER, reg.password))
    write_private(reg.authfile, json.dumps(docker_config(reg.address, USER, reg.password)))
    reg.cert_dir.mkdir(exist_ok=True)
    shutil.copy(reg.ca, reg.cert_dir / "ca.crt")
    data_dir().mkdir(parents=True, exist_ok=True)
    conf = config(reg.address, data_dir(), cert, key, reg.htpasswd, secrets.token_hex(16))
    write_private(root / "config.yml", yaml.safe_dump(conf))
    if node_ip:
        hosts = hosts_dir(cluster.root) / NAME / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(hosts_toml(reg.node_address, reg.ca))
    record = {"address": reg.address, "user": USER, "node_ip": node_ip}
    (root / "registry.json").write_text(json.dumps(record))
    t0 = time.monotonic()
    cluster.procs.start(PROCESS, [str(comp.path("registry")), "serve", str(root / "config.yml")])
    cluster.procs.wait_ready(
        PROCESS, lambda: ready(reg.address, reg.ca) == 401, timeout, RegistryError, "the registry"
    )
    log(f"devcluster: registry {comp.version} on https://{reg.address} in {time.monotonic() - t0:.1f} s")
    return reg


def podman_push(reg: Registry, local: str, repository: str, podman: list[str] | None = None) -> str:
    """Push podman's image ``local`` as ``repository``; return the name nodes pull it by.

    The CA comes from :attr:`Registry.cert_dir` and the credentials from :attr:`Registry.authfile`:
    nothing secret on the command line.
    """
    argv = [
        *(podman or ["podman", "--runtime", "/usr/sbin/runc"]),
        "push",
        "--quiet",
        "--cert-dir",
        str(reg.cert_dir),
        "--authfile",
        str(reg.authfile),
        local,
        f"docker://{reg.push_ref(repository)}",
    ]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise RegistryError(
            f"podman push {local} to {reg.push_ref(repository)} failed: {r.stderr.strip()[-2000:]}"
        )
    return reg.image(repository)
