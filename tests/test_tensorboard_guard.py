"""TensorBoard on Kubernetes answers only its owner's notebook server: the guard, the token file,
and the notebook server's proxy that adds the token (pure and local parts; the attack on the
real node is in ``tests/test_kube_views.py``)."""

from __future__ import annotations

import stat

import pytest

from tfk8s_magics import tbtokens
from tfk8s_magics.runtime.tensorboard import READY_PATH, REFUSAL, require_token


def _call(app, path="/data/runs", **headers):
    seen = {}

    def start_response(status, hdrs):
        seen["status"], seen["headers"] = status, dict(hdrs)

    environ = {"PATH_INFO": path, **{f"HTTP_{k.upper()}": v for k, v in headers.items()}}
    body = b"".join(app(environ, start_response))
    return seen["status"], body


def _tensorboard(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json")])
    return [b'["progress"]']


def test_the_guard_passes_only_the_token_and_answers_readiness_alone():
    app = require_token(_tensorboard, "s3cret")
    assert _call(app) == ("401 Unauthorized", REFUSAL)
    assert _call(app, authorization="Bearer wrong") == ("401 Unauthorized", REFUSAL)
    assert _call(app, authorization="Bearer s3cret-and-more") == ("401 Unauthorized", REFUSAL)
    assert _call(app, authorization="token s3cret")[0] == "401 Unauthorized"
    assert _call(app, authorization="Bearer s3cret") == ("200 OK", b'["progress"]')
    assert _call(app, path=READY_PATH) == ("200 OK", b"ready\n")  # what the probe asks: nothing more


def test_tokens_are_kept_owner_only_and_hosts_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    host = "mnist-tensorboard.lab-ada.svc"
    assert tbtokens.load(host) is None
    tbtokens.save(host, "mnist-tensorboard-abc123", "t0k")
    assert tbtokens.load(host) == ("mnist-tensorboard-abc123", "t0k")
    path = tbtokens.folder() / host
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for bad in ("../../etc/passwd", "a/b", "", "UPPER.svc"):
        with pytest.raises(ValueError):
            tbtokens.save(bad, "s", "t")
        assert tbtokens.load(bad) is None
    assert not [p for p in tbtokens.folder().iterdir() if p.name.startswith(".")]


@pytest.fixture
def guarded_tensorboard():
    """A guarded WSGI app on 127.0.0.1 (TensorBoard's place) that echoes the headers it got."""
    import json
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    def echo(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/json")])
        got = {k[5:]: v for k, v in environ.items() if k.startswith("HTTP_")}
        return [json.dumps({"path": environ["PATH_INFO"], "headers": got}).encode()]

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server("127.0.0.1", 0, require_token(echo, "t0k"), handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()
    server.server_close()


def test_the_notebook_servers_proxy_adds_the_token_and_forwards_no_browser_credential(
        tmp_path, state_dir, guarded_tensorboard, monkeypatch):
    """What another user gets (no token: 401, asked directly), what the owner's server gets (its
    proxy adds the token from the owner's file), and that without the file the proxy gets 401
    too: the token is what lets a request in, not the network path."""
    import urllib.error
    import urllib.request

    from tests.browserlab import Lab

    port = guarded_tensorboard
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(tmp_path, state_dir, root)
    lab.env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    with pytest.raises(urllib.error.HTTPError) as e:  # the attack: straight to TensorBoard
        urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=10)
    assert e.value.code == 401 and e.value.read() == REFUSAL
    lab.start()
    try:
        path = f"/tfk8s/tensorboard/127.0.0.1:{port}/data/runs"
        status, body = lab.request("GET", path)
        assert status == 401, (status, body)  # no token kept: TensorBoard refuses the proxy too
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # the server's, as in its pod
        tbtokens.save("127.0.0.1", "tb-secret", "t0k")
        status, body = lab.request("GET", path, headers={"Cookie": "session=the-users"})
        assert status == 200, (status, body)
        assert body["path"] == "/data/runs"
        assert body["headers"]["AUTHORIZATION"] == "Bearer t0k"
        assert "COOKIE" not in body["headers"]  # the browser's credentials stay with the server
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", lab.port, timeout=30)
        conn.request("GET", path)  # no login: the proxy itself is behind the server's login
        answer = conn.getresponse()
        assert answer.status in (302, 403) and b"t0k" not in answer.read(), answer.status
        conn.close()
    finally:
        lab.close()
