"""The hub itself inside Kubernetes: endpoints, login, database, from the chart's ``hub`` values.

The chart runs the proxy as its own Deployment (so users' connections
survive a hub restart) and passes secrets as environment variables from a
Secret: ``CONFIGPROXY_AUTH_TOKEN`` (read by JupyterHub itself),
``JPY_COOKIE_SECRET`` (likewise) and ``TFK8S_SHARED_PASSWORD``.
"""

from __future__ import annotations

import os
from typing import Any


def configure_hub(c: Any, hub: dict[str, Any], environ: dict[str, str] | None = None) -> None:
    """Apply the chart's ``hub`` values to the JupyterHub config object ``c``."""
    env = os.environ if environ is None else environ
    # The hub listens in its pod; users' servers and the proxy reach it through its Service.
    c.JupyterHub.hub_bind_url = "http://:8081"
    if hub.get("hubService"):
        c.JupyterHub.hub_connect_url = f"http://{hub['hubService']}:8081"
    if hub.get("proxyApiService"):
        c.ConfigurableHTTPProxy.api_url = f"http://{hub['proxyApiService']}:8001"
        c.ConfigurableHTTPProxy.should_start = False
    # servers outlive a hub restart (an upgrade, a config change)
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.db_url = hub.get("dbUrl") or "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
    c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"
    if hub.get("baseUrl"):
        c.JupyterHub.base_url = hub["baseUrl"]

    auth = hub.get("auth", {})
    c.JupyterHub.authenticator_class = auth.get("class", "shared-password")
    if c.JupyterHub.authenticator_class == "shared-password" and env.get("TFK8S_SHARED_PASSWORD"):
        c.SharedPasswordAuthenticator.user_password = env["TFK8S_SHARED_PASSWORD"]
    if auth.get("adminUsers"):
        c.Authenticator.admin_users = set(auth["adminUsers"])
    if auth.get("allowedUsers"):
        c.Authenticator.allowed_users = set(auth["allowedUsers"])
    c.Authenticator.allow_all = bool(auth.get("allowAll", False))
