"""The test cluster's OIDC provider (devcluster/identity.py): Dex, built from its module, serving
its issuer over HTTPS on 127.0.0.1 with a certificate of the cluster CA, and a real JupyterHub whose
``oauthenticator`` GenericOAuthenticator signs users in through it. The authorization-code flow is
driven over HTTP the way a browser follows it: the hub's login redirects to Dex, Dex's login form
takes the user's password, Dex redirects back with a code, the hub trades the code for a token.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import bcrypt
import psutil
import pytest
import requests

from devcluster import identity
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent


def test_dex_is_pinned_as_a_pseudo_version_through_a_consumer_module():
    from devcluster import build
    from devcluster.versions import versions

    v = versions()["DEX"]
    assert re.fullmatch(r"v0\.0\.0-\d{14}-[0-9a-f]{12}", v), v
    gomod = (REPO / "devcluster" / "go" / "dex" / "go.mod").read_text()
    assert f"github.com/dexidp/dex {v}" in gomod
    assert re.search(r"github.com/dexidp/dex/api/v2 v2\.\d+\.\d+", gomod)
    assert build.COMPONENTS["dex"].version_key == "DEX"


def test_config_is_https_memory_static_users_and_one_client(tmp_path):
    user = identity.static_user("alice", "alice@tfk8s.test", "pw-of-alice")
    assert bcrypt.checkpw(b"pw-of-alice", user["hash"].encode())
    assert user["userID"] == identity.static_user("alice", "alice@tfk8s.test", "other")["userID"]
    cfg = identity.config(
        "https://127.0.0.1:5556/dex",
        "127.0.0.1:5556",
        tmp_path / "d.crt",
        tmp_path / "d.key",
        [user],
        "s3cret",
        ["https://lab.tfk8s.test/hub/oauth_callback"],
    )
    assert cfg == {
        "issuer": "https://127.0.0.1:5556/dex",
        "storage": {"type": "memory"},
        "web": {
            "https": "127.0.0.1:5556",
            "tlsCert": str(tmp_path / "d.crt"),
            "tlsKey": str(tmp_path / "d.key"),
        },
        "logger": {"level": "info", "format": "text"},
        "oauth2": {"skipApprovalScreen": True, "responseTypes": ["code"]},
        "enablePasswordDB": True,
        "staticPasswords": [user],
        "staticClients": [
            {
                "id": "tfk8s-hub",
                "name": "tfk8s-lab",
                "secret": "s3cret",
                "redirectURIs": ["https://lab.tfk8s.test/hub/oauth_callback"],
            }
        ],
    }


def test_a_client_without_a_redirect_uri_is_refused_in_one_sentence(tmp_path):
    from devcluster.cluster import Cluster

    with pytest.raises(identity.IdentityError, match="redirect URI"):
        identity.up(Cluster(tmp_path / "c"), [])
    assert not (tmp_path / "c").exists()


# -- Dex and a real JupyterHub ------------------------------------------------------------------

HUB_CONFIG = """
c.JupyterHub.bind_url = {bind!r}
c.JupyterHub.hub_bind_url = {hub_bind!r}
c.ConfigurableHTTPProxy.api_url = {api!r}
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = {db!r}
c.JupyterHub.cookie_secret_file = {secret!r}
c.JupyterHub.pid_file = {pid!r}
c.JupyterHub.authenticator_class = "generic-oauth"
c.GenericOAuthenticator.client_id = "tfk8s-hub"
c.GenericOAuthenticator.client_secret = {client_secret!r}
c.GenericOAuthenticator.oauth_callback_url = {callback!r}
c.GenericOAuthenticator.authorize_url = {authorize!r}
c.GenericOAuthenticator.token_url = {token!r}
c.GenericOAuthenticator.userdata_url = {userinfo!r}
c.GenericOAuthenticator.scope = ["openid", "email", "profile"]
c.GenericOAuthenticator.username_claim = "preferred_username"
c.GenericOAuthenticator.allowed_users = {{"alice"}}
# the issuer's certificate is signed by the cluster CA: trust that CA, and only for these requests
c.OAuthenticator.http_request_kwargs = {{"ca_certs": {ca!r}}}
"""


@pytest.fixture(scope="module")
def dex_and_hub(tmp_path_factory):
    """Dex (as devcluster/identity.py starts it) and a JupyterHub signing users in through it."""
    from devcluster import build
    from devcluster.cluster import Cluster
    from tfk8s_magics.ports import free_ports

    if not build.COMPONENTS["dex"].is_built() and shutil.which("go") is None:
        pytest.skip("Dex is not built and Go is missing: scripts/kube build dex")
    chp = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    if not chp.exists():
        pytest.skip("configurable-http-proxy is missing: scripts/bootstrap")
    tmp = tmp_path_factory.mktemp("oidc")
    port, hub_port, api_port = free_ports(3)
    hub = f"http://127.0.0.1:{port}"
    callback = f"{hub}/hub/oauth_callback"
    cluster = Cluster(tmp / "cluster")
    ident = identity.up(cluster, [callback], log=lambda *_: None)
    conf = tmp / "jupyterhub_config.py"
    conf.write_text(
        HUB_CONFIG.format(
            bind=hub,
            hub_bind=f"http://127.0.0.1:{hub_port}",
            api=f"http://127.0.0.1:{api_port}",
            chp=str(chp),
            db=f"sqlite:///{tmp / 'hub.sqlite'}",
            secret=str(tmp / "cookie_secret"),
            pid=str(tmp / "hub.pid"),
            client_secret=ident.client_secret,
            callback=callback,
            authorize=ident.endpoint("authorize"),
            token=ident.endpoint("token"),
            userinfo=ident.endpoint("userinfo"),
            ca=str(ident.ca),
        )
    )
    log = open(tmp / "hub.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(conf)], cwd=tmp, stdout=log, stderr=subprocess.STDOUT
    )

    def up() -> bool:
        try:
            return requests.get(f"{hub}/hub/api/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(up, 90, "the hub to answer", interval=0.5)
        yield ident, hub
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.terminate()
        proc.terminate()
        proc.wait(30)
        log.close()
        cluster.procs.stop(identity.PROCESS)


def _log_in(
    ident: identity.Identity, hub: str, user: str, password: str
) -> tuple[requests.Session, requests.Response]:
    """Follow the authorization-code flow as a browser does; the hub's answer to Dex's redirect."""
    s = requests.Session()
    r = s.get(f"{hub}/hub/oauth_login", allow_redirects=False, timeout=10)
    assert r.status_code == 302, r.text
    to_dex = r.headers["Location"]
    assert to_dex.startswith(ident.endpoint("authorize") + "?"), to_dex
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(to_dex).query)["client_id"] == ["tfk8s-hub"]
    page = s.get(to_dex, verify=str(ident.ca), timeout=10)  # Dex: its one connector's login form
    assert page.status_code == 200, page.text
    action = html.unescape(re.search(r'<form[^>]*method="post"[^>]*action="([^"]+)"', page.text).group(1))
    form = urllib.parse.urljoin(page.url, action)
    r = s.post(form, data={"login": identity.USERS[user], "password": password}, verify=str(ident.ca),
               allow_redirects=False, timeout=10)  # fmt: skip
    while r.status_code in (302, 303) and r.headers["Location"].startswith(("/dex/", ident.issuer)):
        r = s.get(urllib.parse.urljoin(form, r.headers["Location"]), verify=str(ident.ca),
                  allow_redirects=False, timeout=10)  # fmt: skip
    if r.status_code not in (302, 303):
        return s, r  # Dex kept the user (a wrong password shows its form again)
    back = r.headers["Location"]
    assert back.startswith(f"{hub}/hub/oauth_callback?code="), back
    return s, s.get(back, allow_redirects=False, timeout=30)


def test_discovery_over_tls_signed_by_the_cluster_ca_on_loopback_only(dex_and_hub):
    ident, _ = dex_and_hub
    doc = identity.discovery(ident.issuer, ident.ca)
    assert doc["issuer"] == ident.issuer and ident.issuer.startswith("https://127.0.0.1:")
    assert doc["authorization_endpoint"] == ident.endpoint("authorize")
    assert doc["token_endpoint"] == ident.endpoint("token")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{ident.issuer}/.well-known/openid-configuration", timeout=5)  # the system's roots
    cluster_dir = ident.root.parent
    pid = int((cluster_dir / "procs" / "dex.json").read_text().split('"pid": ')[1].split(",")[0])
    listening = {c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}, listening


def test_the_hub_signs_a_user_in_through_dex(dex_and_hub):
    ident, hub = dex_and_hub
    s, r = _log_in(ident, hub, "alice", ident.passwords["alice"])
    assert r.status_code == 302, r.text
    assert "jupyterhub-session-id" in s.cookies.get_dict()
    home = s.get(f"{hub}/hub/home", allow_redirects=False, timeout=10)
    assert home.status_code == 200 and "alice" in home.text


def test_a_wrong_password_gets_no_code_and_a_user_not_allowed_gets_no_session(dex_and_hub):
    ident, hub = dex_and_hub
    s, r = _log_in(ident, hub, "alice", ident.passwords["alice"] + "x")
    assert r.status_code == 401 and "Invalid" in r.text  # Dex shows its form again
    assert "jupyterhub-session-id" not in s.cookies.get_dict()
    # bob is a real Dex user, with his real password, whom the hub does not allow
    s, r = _log_in(ident, hub, "bob", ident.passwords["bob"])
    assert r.status_code == 403, r.text
    assert s.get(f"{hub}/hub/home", allow_redirects=False, timeout=10).status_code == 302  # to the login
