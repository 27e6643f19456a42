"""JupyterHub on one machine: what ``scripts/lab`` runs (``jupyterhub -f`` this file).

Everything listens on 127.0.0.1 only.  Users log in with any name and the
shared password; each gets a local notebook server whose kernels have the
``%tfcluster`` magics loaded, on the extension's ``local`` backend.

Environment (all optional):

* ``TFK8S_LAB_DIR`` -- state: database, cookie secret, users' homes (default ``<repo>/.lab``)
* ``TFK8S_LAB_PORT`` -- the lab's URL port (default 8000); ``TFK8S_LAB_HUB_PORT`` (8081)
  and ``TFK8S_LAB_PROXY_API_PORT`` (8001) for the hub's internal endpoints
* ``TFK8S_LAB_PASSWORD`` -- the shared password (default ``tfk8s-lab``, at least 8 characters)
* ``TFK8S_LAB_ADMIN_TOKEN`` -- an API token with admin rights (for scripts and tests)
* ``TFK8S_LAB_DOCS`` -- the built manual the lab serves at ``/services/docs/`` when it exists
  (default ``<repo>/build/docs/html``, what ``scripts/docs build`` writes)

The lab settings (``c.LabSettings.*``, see hub_config/tfk8s_hub/settings.py)
apply here too; ``default_backend`` is forced to ``local``.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from jupyterhub.spawner import Spawner  # noqa: E402
from tfk8s_hub.docs import docs_link, docs_service  # noqa: E402
from tfk8s_hub.local import (  # noqa: E402
    lab_password,
    lab_ports,
    login_hint,
    make_post_stop_hook,
    make_pre_spawn_hook,
)
from tfk8s_hub.settings import LabSettings  # noqa: E402

from tfk8s_magics.ports import free_port  # noqa: E402

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

lab_dir = Path(os.environ.get("TFK8S_LAB_DIR") or REPO / ".lab").resolve()
lab_dir.mkdir(parents=True, exist_ok=True)
ports = lab_ports(dict(os.environ))
port = ports["TFK8S_LAB_PORT"]
hub_port = ports["TFK8S_LAB_HUB_PORT"]
proxy_api_port = ports["TFK8S_LAB_PROXY_API_PORT"]

# --- the hub, its proxy and its state: 127.0.0.1 only -----------------------
c.JupyterHub.bind_url = f"http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [str(REPO / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(lab_dir / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{lab_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(lab_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(lab_dir / "jupyterhub.pid")

# --- login: any user name, one shared password ------------------------------
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = lab_password(dict(os.environ))
c.Authenticator.allow_all = True
# The login page says how to log in (JupyterHub's documented ``announcement_login`` template
# variable; a custom password itself is never shown).
c.JupyterHub.template_vars = {"announcement_login": login_hint(dict(os.environ))}

admin_token = os.environ.get("TFK8S_LAB_ADMIN_TOKEN")
if admin_token:
    c.JupyterHub.services = [{"name": "lab-admin", "api_token": admin_token}]
    c.JupyterHub.load_roles = [{"name": "admin", "services": ["lab-admin"]}]

# --- the manual, when it has been built (scripts/docs build): /services/docs/ ------------
docs = docs_service(Path(os.environ.get("TFK8S_LAB_DOCS") or REPO / "build" / "docs" / "html"),
                    free_port())
if docs:
    c.JupyterHub.services = [*c.JupyterHub.get("services", []), docs]
    c.JupyterHub.template_vars["announcement_login"] += docs_link()
    c.JupyterHub.template_vars["announcement_home"] = docs_link().strip()

# --- users' servers: local processes, the extension on its local backend ----
settings = LabSettings(config=c, default_backend="local")
c.JupyterHub.spawner_class = "simple"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 60
if hasattr(os, "geteuid") and os.geteuid() == 0:
    c.Spawner.args = ["--allow-root"]
c.Spawner.pre_spawn_hook = make_pre_spawn_hook(settings, lab_dir)
c.Spawner.post_stop_hook = make_post_stop_hook(settings, lab_dir)
# The lab's TMPDIR reaches the servers and their kernels: what they put there goes with the lab.
c.Spawner.env_keep = [*Spawner.class_traits()["env_keep"].default(), "TMPDIR"]
# TensorBoard in a notebook goes through jupyter-server-proxy, behind the hub's login.
c.Spawner.environment = {
    "TENSORBOARD_PROXY_URL": lambda spawner: spawner.user.server_url(spawner.name) + "proxy/%PORT%/"
}
