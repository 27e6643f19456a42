"""The TF clusters sidebar of JupyterLab: a jupyter_server extension plus a prebuilt labextension.

The server part (:mod:`.handlers`) serves the user's clusters over REST and a WebSocket
under ``/tfk8s/``, from one :class:`~.monitor.ClusterMonitor` per server; the browser part
is the labextension built from ``labextension/`` (TypeScript) into ``labextension/`` here by
``scripts/bootstrap lab``, and installed with the package into
``share/jupyter/labextensions/tfk8s-sidebar``.  Both are enabled by files the package
installs (``etc/jupyter/jupyter_server_config.d/tfk8s_magics.json``), so a ``pip install``
and ``jupyter lab`` show the sidebar with nothing else to do.

Settings: ``c.TFClusterSidebar.discover_every`` (seconds between listings of the clusters).
"""

from __future__ import annotations

from pathlib import Path

from traitlets import Float
from traitlets.config import Configurable

#: The server extension's setting (``c.TFClusterSidebar``); the rest is Jupyter's discovery hooks.
__all__ = ["TFClusterSidebar"]

HERE = Path(__file__).parent


class TFClusterSidebar(Configurable):
    """Settings of the sidebar's server extension."""

    discover_every = Float(
        2.0,
        help="Seconds between two listings of the user's clusters: how soon a cluster launched "
        "elsewhere (a kernel, the tfk8s CLI) or deleted appears in the sidebar. Changes of a known "
        "cluster are pushed as the backend sees them, whatever this is.",
    ).tag(config=True)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "tfk8s-sidebar"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "tfk8s_magics.sidebar"}]


def _load_jupyter_server_extension(server_app) -> None:
    """Add the sidebar's handlers and start its monitor (daemon threads: they end with the server)."""
    # Deferred: jupyter_server and tornado are a server's; `jupyter labextension` reading
    # _jupyter_labextension_paths, or a kernel importing the package, needs none of them.
    from jupyter_server.utils import url_path_join

    # Deferred with them: the handlers import tornado and jupyter_server, the monitor the API.
    from .handlers import ActionHandler, ClusterHandler, ClustersHandler, FormHandler, StreamHandler
    from .monitor import ClusterMonitor

    settings = TFClusterSidebar(parent=server_app)
    web_app = server_app.web_app
    monitor = ClusterMonitor(discover_every=settings.discover_every).start()
    web_app.settings["tfk8s_monitor"] = monitor
    base = url_path_join(web_app.settings["base_url"], "tfk8s")
    name = r"(?P<name>[^/]+)"
    web_app.add_handlers(".*$", [
        (url_path_join(base, "clusters"), ClustersHandler),
        (url_path_join(base, "form"), FormHandler),
        (url_path_join(base, "stream"), StreamHandler),
        (url_path_join(base, "clusters", name), ClusterHandler),
        (url_path_join(base, "clusters", name, r"(?P<action>stop|tensorboard|serve|events)"), ActionHandler),
    ])
    server_app.log.info("tfk8s sidebar: serving the user's clusters under %s", base)
    # A stopped TensorBoard's link: a page that says so and how to start it again (not a bare 500).
    # Deferred, as the handlers: it subclasses jupyter-server-proxy's, a server's package.
    from .stopped import wrap_local_proxy
    from .tbproxy import add_tensorboard_proxy

    wrap_local_proxy(web_app, server_app.log)
    # The user's Kubernetes TensorBoards, with the token they ask of every request.
    add_tensorboard_proxy(web_app, server_app)
