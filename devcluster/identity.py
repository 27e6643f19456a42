"""The test cluster's OIDC provider: Dex with memory storage, static users and a static client.

What a production lab signs its users in with: a real OpenID Connect provider the hub talks to
through ``oauthenticator``'s GenericOAuthenticator. ``dex`` (built from its published module at the
pseudo-version of a release, through the consumer module ``go/dex``; cached by version,
:mod:`devcluster.build`) serves its issuer over HTTPS on 127.0.0.1 with a certificate signed by
the cluster CA (:mod:`devcluster.pki`), keeps everything in memory, and knows

- static users (:data:`USERS`), each with a random password kept in ``<dir>/users.json`` (0600)
  and given to Dex as a bcrypt hash only;
- one static client, the hub (:data:`CLIENT_ID`), with a random secret and the exact redirect
  URIs it is started with (a confidential client: Dex accepts no other).

The pure builders (``config``, ``static_user``) return data; :func:`up` performs them and waits
for :func:`discovery`.
"""

from __future__ import annotations

import json
import secrets
import ssl
import time
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


def up(
    cluster, redirect_uris: list[str], host: str = "127.0.0.1", timeout: float = 60.0, log=print
) -> Identity:
    """Start Dex for ``cluster`` (a process of the cluster's); the hub may return to ``redirect_uris``."""
    if not redirect_uris:
        raise IdentityError(
            "Dex needs the hub's redirect URI (https://HOST/hub/oauth_callback) for its client"
        )
    comp = build.ensure("dex")
    root = cluster.root / "identity"
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    listen = f"{host}:{free_port(host)}"
    issuer = f"https://{listen}/dex"
    cert, key = CA(cluster.pki).issue("dex", "dex", ips=(host,), server=True)
    passwords = {name: secrets.token_urlsafe(12) for name in USERS}
    client_secret = secrets.token_urlsafe(24)
    users = [static_user(name, USERS[name], pw) for name, pw in passwords.items()]
    conf = config(issuer, listen, cert, key, users, client_secret, redirect_uris)
    write_private(root / "config.yaml", yaml.safe_dump(conf))
    ident = Identity(root, issuer, cluster.pki / "ca.crt", client_secret, passwords)
    write_private(
        root / "identity.json",
        json.dumps(
            {"issuer": issuer, "client_id": CLIENT_ID, "client_secret": client_secret, "passwords": passwords}
        ),
    )
    t0 = time.monotonic()
    cluster.procs.start(PROCESS, [str(comp.path("dex")), "serve", str(root / "config.yaml")])
    cluster.procs.wait_ready(
        PROCESS,
        lambda: discovery(issuer, ident.ca)["issuer"] == issuer,
        timeout,
        IdentityError,
        "Dex",
        tolerate=(OSError, ValueError),
    )
    log(f"devcluster: Dex {comp.version} at {issuer} in {time.monotonic() - t0:.1f} s")
    return ident
