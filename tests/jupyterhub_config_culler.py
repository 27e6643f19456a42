"""The local profile plus the idle culler exactly as the chart's hub runs it, idle after 2 s.

Used by tests/test_hub_e2e.py: ``tfk8s_hub.hub.culler_service`` builds the
service and its role (the same function ``configure_hub`` calls in the
chart's hub); only the timeout and the hub's address differ.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
load_subconfig(str(REPO / "hub_config" / "jupyterhub_config_local.py"))  # noqa: F821

from tfk8s_hub.hub import culler_service  # noqa: E402

c = get_config()  # noqa: F821
service, role = culler_service(
    {"enabled": True, "timeout": 2, "every": 1},
    hub_url=f"http://127.0.0.1:{os.environ['TFK8S_LAB_HUB_PORT']}",
)
c.JupyterHub.services = [*c.JupyterHub.get("services", []), service]
c.JupyterHub.load_roles = [*c.JupyterHub.get("load_roles", []), role]
