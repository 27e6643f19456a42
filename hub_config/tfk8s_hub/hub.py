"""The hub itself inside Kubernetes: endpoints, login, database, from the chart's ``hub`` values.

The chart runs the proxy as its own Deployment (so users' connections
survive a hub restart) and passes secrets as environment variables from a
Secret: ``CONFIGPROXY_AUTH_TOKEN`` (read by JupyterHub itself),
``JPY_COOKIE_SECRET`` (likewise) and ``TFK8S_SHARED_PASSWORD``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: The culler's service name, and its role's (as Zero-to-JupyterHub names them).
CULLER = "jupyterhub-idle-culler"


def _service_host(service: str, hub: dict[str, Any], env: Any) -> str:
    """``<service>.<namespace>.svc``: a Service's name that resolves from every namespace."""
    namespace = hub.get("namespace") or env.get("POD_NAMESPACE")
    return f"{service}.{namespace}.svc" if namespace else service


def configure_hub(c: Any, hub: dict[str, Any], environ: dict[str, str] | None = None) -> None:
    """Apply the chart's ``hub`` values to the JupyterHub config object ``c``."""
    env = os.environ if environ is None else environ
    # The hub listens in its pod; users' servers and the proxy reach it through its Service.
    c.JupyterHub.hub_bind_url = "http://:8081"
    if hub.get("hubService"):
        # Notebooks run in their users' namespaces, whose DNS search path does not
        # include the hub's: only the namespace-qualified name resolves there.
        c.JupyterHub.hub_connect_url = f"http://{_service_host(hub['hubService'], hub, env)}:8081"
    if hub.get("proxyApiService"):
        c.ConfigurableHTTPProxy.api_url = f"http://{_service_host(hub['proxyApiService'], hub, env)}:8001"
        c.ConfigurableHTTPProxy.should_start = False
    # servers outlive a hub restart (an upgrade, a config change)
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.db_url = hub.get("dbUrl") or "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
    c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"
    if hub.get("concurrentSpawnLimit") is not None:
        c.JupyterHub.concurrent_spawn_limit = int(hub["concurrentSpawnLimit"])
    if hub.get("baseUrl"):
        c.JupyterHub.base_url = hub["baseUrl"]
    culler = culler_service(hub.get("cull") or {}, hub.get("baseUrl") or "/")
    if culler:
        service, role = culler
        c.JupyterHub.services = [*c.JupyterHub.get("services", []), service]
        c.JupyterHub.load_roles = [*c.JupyterHub.get("load_roles", []), role]

    auth = hub.get("auth", {})
    c.JupyterHub.authenticator_class = auth.get("class", "shared-password")
    if c.JupyterHub.authenticator_class == "shared-password" and env.get("TFK8S_SHARED_PASSWORD"):
        c.SharedPasswordAuthenticator.user_password = env["TFK8S_SHARED_PASSWORD"]
    if auth.get("adminUsers"):
        c.Authenticator.admin_users = set(auth["adminUsers"])
    if auth.get("allowedUsers"):
        c.Authenticator.allowed_users = set(auth["allowedUsers"])
    c.Authenticator.allow_all = bool(auth.get("allowAll", False))


def culler_service(
    cull: dict[str, Any], base_url: str = "/", hub_url: str = "http://127.0.0.1:8081"
) -> tuple[dict, dict] | None:
    """The idle culler as a hub-managed service, and its role (``None`` when disabled).

    ``jupyterhub-idle-culler`` asks the hub API (from inside the hub's pod) for
    servers idle longer than ``timeout`` and stops them; the hub's
    ``post_stop_hook`` then stops that user's TensorFlow clusters.  The
    scopes are the culler's documented minimum; ``admin:users`` only when it
    deletes users too (``adminUsers: false`` then spares admins).  ``hub_url``
    is where the hub listens, seen from its own pod.
    """
    if not cull.get("enabled", False):
        return None
    api = f"{hub_url}{base_url.rstrip('/')}/hub/api"
    command = [
        sys.executable, "-m", "jupyterhub_idle_culler",
        f"--url={api}",
        f"--timeout={int(cull.get('timeout', 3600))}",
        f"--cull-every={int(cull.get('every', 600))}",
        f"--concurrency={int(cull.get('concurrency', 10))}",
    ]
    if cull.get("maxAge"):
        command.append(f"--max-age={int(cull['maxAge'])}")
    if cull.get("users"):
        command.append("--cull-users")
    if cull.get("removeNamedServers"):
        command.append("--remove-named-servers")
    if not cull.get("adminUsers", True):
        command.append("--cull-admin-users=false")
    scopes = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
    if cull.get("users"):
        scopes.append("admin:users")
    return (
        {"name": CULLER, "command": command},
        {"name": CULLER, "scopes": scopes, "services": [CULLER]},
    )
