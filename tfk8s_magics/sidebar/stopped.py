"""A page that says what happened when a proxied TensorBoard (or model server) has stopped.

A cluster's TensorBoard is shown through jupyter-server-proxy (``/proxy/PORT/``).  Once that
server has stopped — its cluster was deleted, or the kernel that started it ended — the link and
the dashboard's iframe used to get jupyter-server-proxy's bare "500 : Internal Server Error".
This module wraps the proxy's local handler: when nothing listens on the port any more, the
answer is a short page (HTTP 502) that says so and how to start it again; every other answer,
and every other error, is the proxy's own.
"""

from __future__ import annotations

import html
import socket

#: How long the check that the port is closed may take (a loopback connect).
PROBE_TIMEOUT = 0.5


def port_closed(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing serves ``host:port`` any more: the connect is refused, or the host's name
    no longer resolves (a Kubernetes Service deleted with its cluster)."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return False
    except (ConnectionRefusedError, socket.gaierror):
        return True
    except OSError:  # a timeout or another error: not known to be stopped
        return False


def stopped_page(port: int | str) -> str:
    """The page shown for a proxied port (``PORT`` or ``HOST:PORT``) where nothing listens any more."""
    p = html.escape(str(port))
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Stopped: nothing on port "
        f"{p}</title></head><body style=\"font-family:sans-serif;max-width:46em;margin:2em\">"
        f'<h2 class="tfk8s-stopped">This server has stopped: nothing answers on port {p} any more.</h2>'
        "<p>If it was a cluster's TensorBoard, it stopped when the cluster was deleted or when the "
        "kernel that started it ended; its logs are where they were unless the cluster was deleted "
        "without <code>--keep-logs</code>.</p>"
        "<p>Start it again with <code>%tfcluster tensorboard NAME</code> in a notebook (or the "
        "<b>TensorBoard</b> button of the cluster's dashboard, or <code>tfk8s tensorboard NAME</code> "
        "in a terminal): it gets a new link.</p></body></html>"
    )


def wrap_local_proxy(web_app, log) -> bool:
    """Give jupyter-server-proxy's ``/proxy/PORT/`` and ``/proxy/HOST:PORT/`` handlers the stopped
    page; whether they were found.

    The proxy's own rules keep their place and arguments: only their handler classes are
    replaced by subclasses that differ in ``write_error`` alone.
    """
    try:
        from jupyter_server_proxy.handlers import LocalProxyHandler, RemoteProxyHandler
    except ImportError:
        return False

    def write_error(self, status_code: int, parent, host: str, port: str, **kwargs) -> None:
        if status_code in (500, 599) and port.isdigit() and port_closed(int(port), host):
            self.set_status(502)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.write(stopped_page(port if host == "127.0.0.1" else f"{host}:{port}"))
            return
        parent.write_error(self, status_code, **kwargs)

    class LocalStoppedPage(LocalProxyHandler):
        """jupyter-server-proxy's ``/proxy/PORT/``, with the stopped page for a closed port."""

        def write_error(self, status_code: int, **kwargs) -> None:
            port = self.path_args[0] if self.path_args else ""
            write_error(self, status_code, LocalProxyHandler, "127.0.0.1", port, **kwargs)

    class RemoteStoppedPage(RemoteProxyHandler):
        """jupyter-server-proxy's ``/proxy/HOST:PORT/``, with the stopped page for a closed port."""

        def write_error(self, status_code: int, **kwargs) -> None:
            host, port = (self.path_args[:2] if len(self.path_args) >= 2 else ("", ""))
            write_error(self, status_code, RemoteProxyHandler, host, port, **kwargs)

    wrapped = {LocalProxyHandler: LocalStoppedPage, RemoteProxyHandler: RemoteStoppedPage}
    found = False
    for host_rule in web_app.default_router.rules:
        for rule in getattr(host_rule.target, "rules", ()):
            if rule.target in wrapped:
                rule.target = wrapped[rule.target]
                found = True
    if not found:
        log.warning("tfk8s: jupyter-server-proxy's /proxy/ handlers were not found; a stopped "
                    "TensorBoard's link will show the proxy's own error page")
    return found
