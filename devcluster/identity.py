"""The test cluster's OIDC provider: Dex with memory storage, static users and a static client.

What a production lab signs its users in with: a real OpenID Connect provider the hub talks to
through ``oauthenticator``'s GenericOAuthenticator. ``dex`` (built from its published module at the
pseudo-version of a release, through the consumer module ``go/dex``; cached by version,
:mod:`devcluster.build`) serves its issuer over HTTPS with a certificate signed by the cluster CA
(:mod:`devcluster.pki`) for the address it listens on, keeps everything in memory, and knows

- static users (:data:`USERS`), each with a random password kept in ``<dir>/identity.json`` (0600)
  and given to Dex as a bcrypt hash only;
- one static client, the hub (:data:`CLIENT_ID`), with a random secret and the exact redirect
  URIs it is started with (a confidential client: Dex accepts no other).

It listens either on 127.0.0.1 (a free port; the hub of a test on this host), or, for
``scripts/kube up --pods``, inside the slot's SSO host (:attr:`devcluster.network.Slot.sso_netns`)
on :attr:`~devcluster.network.Slot.sso_ip` and :data:`PORT`, where both the hub's pod and a
browser on this host reach the same issuer URL.

The pure builders (``config``, ``static_user``) return data; :func:`up` performs them and waits
for :func:`discovery`; :func:`load` reads what it recorded.
"""

from __future__ import annotations

import json
import secrets
import ssl
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from . import build
from .hostfiles import free_port, write_private
from .pki import CA

CLIENT_ID = "tfk8s-hub"
#: the users Dex knows: name -> e-mail (the e-mail is what its login form asks for)
USERS = {"alice": "alice@tfk8s.test", "bob": "bob@tfk8s.test"}
PROCESS = "dex"
#: Dex's port in the SSO host's namespace (its own address: nothing else listens there)
PORT = 5556


class IdentityError(RuntimeError):
    """Dex could not be started; the message says what failed and what to do."""


@dataclass(frozen=True)
class Identity:
    """A running (or configured) Dex of one directory."""

    root: Path
    issuer: str
    ca: Path
    client_secret: str
    passwords: dict[str, str]  # user name -> password

    def endpoint(self, name: str) -> str:
        """``authorize``, ``token``, ``userinfo``: Dex's OAuth endpoints under the issuer."""
        return f"{self.issuer}/{ {'authorize': 'auth', 'token': 'token', 'userinfo': 'userinfo'}[name] }"


# -- pure builders ------------------------------------------------------------------------------


def static_user(name: str, email: str, password: str) -> dict:
    """One of Dex's ``staticPasswords`` (a bcrypt hash, a stable user id derived from the name)."""
    return {
        "username": name,
        "email": email,
        "preferredUsername": name,
        "hash": bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode(),
        "userID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"tfk8s-devcluster-user:{name}")),
    }


def config(
    issuer: str,
    listen: str,
    cert: Path,
    key: Path,
    users: list[dict],
    client_secret: str,
    redirect_uris: list[str],
) -> dict:
    """Dex's configuration: HTTPS only, memory storage, the password database, one client."""
    return {
        "issuer": issuer,
        "storage": {"type": "memory"},
        "web": {"https": listen, "tlsCert": str(cert), "tlsKey": str(key)},
        "logger": {"level": "info", "format": "text"},
        "oauth2": {"skipApprovalScreen": True, "responseTypes": ["code"]},
        "enablePasswordDB": True,
        "staticPasswords": users,
        "staticClients": [
            {"id": CLIENT_ID, "name": "tfk8s-lab", "secret": client_secret, "redirectURIs": redirect_uris}
        ],
    }


# -- performing ---------------------------------------------------------------------------------


def discovery(issuer: str, ca: Path) -> dict:
    """The issuer's OpenID configuration, fetched over TLS verified by ``ca``."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"{issuer}/.well-known/openid-configuration", context=ctx, timeout=5) as r:
        return json.loads(r.read())


def _root(cluster) -> Path:
    return cluster.root / "identity"


def _record(cluster) -> dict | None:
    try:
        rec = json.loads((_root(cluster) / "identity.json").read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def load(cluster) -> Identity | None:
    """The Dex of ``cluster`` as :func:`up` recorded it, or None (unknown keys are ignored)."""
    rec = _record(cluster)
    try:
        return Identity(
            root=_root(cluster),
            issuer=str(rec["issuer"]),
            ca=cluster.pki / "ca.crt",
            client_secret=str(rec["client_secret"]),
            passwords={str(k): str(v) for k, v in rec["passwords"].items()},
        )
    except (TypeError, KeyError, AttributeError):
        return None


def up(
    cluster,
    redirect_uris: list[str],
    host: str = "127.0.0.1",
    port: int | None = None,
    netns: str | None = None,
    timeout: float = 60.0,
    log=print,
) -> Identity:
    """Start Dex for ``cluster`` (a process of the cluster's); the hub may return to ``redirect_uris``.

    ``netns``: the network namespace (``ip netns``) Dex runs in, on ``host`` (an address there) and
    ``port`` (default :data:`PORT`); without it, on ``host`` and a free port. A Dex of the cluster
    that runs with the same place and redirect URIs is kept; a failed start stops it again.
    """
    if not redirect_uris:
        raise IdentityError(
            "Dex needs the hub's redirect URI (https://HOST/hub/oauth_callback) for its client"
        )
    comp = build.ensure("dex")
    old, rec = load(cluster), _record(cluster)
    if old and cluster.procs.alive(PROCESS):
        where = urllib.parse.urlsplit(old.issuer)
        running = (where.hostname, where.port, rec.get("netns"), rec.get("redirect_uris"))
        if running == (host, port or where.port, netns, list(redirect_uris)):
            return old
        cluster.procs.stop(PROCESS)  # elsewhere, or for other redirect URIs: its certificate, its client
    root = _root(cluster)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    if port is None:
        port = PORT if netns else free_port(host)
    listen = f"{host}:{port}"
    issuer = f"https://{listen}/dex"
    stem = "dex" if host == "127.0.0.1" else f"dex-{host}"  # the CA issues a stem once: one per address
    cert, key = CA(cluster.pki).issue(stem, "dex", ips=(host,), server=True)
    passwords = {name: secrets.token_urlsafe(12) for name in USERS}
    client_secret = secrets.token_urlsafe(24)
    users = [static_user(name, USERS[name], pw) for name, pw in passwords.items()]
    conf = config(issuer, listen, cert, key, users, client_secret, redirect_uris)
    write_private(root / "config.yaml", yaml.safe_dump(conf))
    ident = Identity(root, issuer, cluster.pki / "ca.crt", client_secret, passwords)
    record = {
        "issuer": issuer,
        "client_id": CLIENT_ID,
        "client_secret": client_secret,
        "passwords": passwords,
        "netns": netns,
        "redirect_uris": list(redirect_uris),
    }
    write_private(root / "identity.json", json.dumps(record))
    argv = [str(comp.path("dex")), "serve", str(root / "config.yaml")]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]
    t0 = time.monotonic()
    cluster.procs.start(PROCESS, argv)
    try:
        cluster.procs.wait_ready(
            PROCESS,
            lambda: discovery(issuer, ident.ca)["issuer"] == issuer,
            timeout,
            IdentityError,
            "Dex",
            where=issuer,
            tolerate=(OSError, ValueError),
        )
    except BaseException:
        cluster.procs.stop(PROCESS)
        raise
    log(f"devcluster: Dex {comp.version} at {issuer} in {time.monotonic() - t0:.1f} s")
    return ident


def down(cluster) -> None:
    """Stop Dex (the SSO host's namespace goes with :func:`devcluster.network.sso_down`)."""
    cluster.procs.stop(PROCESS)
