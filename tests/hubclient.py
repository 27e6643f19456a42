"""A JupyterHub user's session over HTTP, as a browser then a script has it: log in with the
form (cookies, xsrf), make an API token with that cookie, then call the hub's REST API with it.
Used by the tests that start the chart's hub and by ``bench/hub_scale.py``."""

from __future__ import annotations

import re

import requests


class Hub:
    """A user's session with the hub through the proxy (a browser's cookies, then an API token)."""

    def __init__(self, url: str, note: str = "test_kube_hub"):
        self.url = url
        self.note = note
        self.s = requests.Session()
        self.token = ""

    def login(self, user: str, password: str) -> requests.Response:
        self.s.get(f"{self.url}/hub/login", timeout=60).raise_for_status()
        xsrf = self.s.cookies.get("_xsrf")
        r = self.s.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": xsrf},
            allow_redirects=False,
            timeout=60,
        )
        if r.status_code == 302:  # logged in: the hub's cookie can now make the user a token
            # a logged-in page carries the session's xsrf token (the login's one was anonymous)
            home = self.s.get(f"{self.url}/hub/home", timeout=60)
            home.raise_for_status()
            xsrf = re.search(r'name="_xsrf" value="([^"]+)"|xsrf_token: "([^"]+)"', home.text)
            assert xsrf, home.text[-2000:]
            t = self.s.post(
                f"{self.url}/hub/api/users/{user}/tokens",
                json={"note": self.note},
                headers={"X-XSRFToken": xsrf.group(1) or xsrf.group(2), "Referer": f"{self.url}/hub/home"},
                timeout=60,
            )
            assert t.status_code == 201, t.text
            self.token = t.json()["token"]
        return r

    def api(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(
            method, f"{self.url}{path}", headers={"Authorization": f"token {self.token}"}, timeout=60, **kw
        )
