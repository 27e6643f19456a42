"""The notebook server's proxy to the user's Kubernetes TensorBoards, adding their token.

A cluster's TensorBoard on Kubernetes answers only requests with its token
(:mod:`tfk8s_magics.runtime.tensorboard`), so reaching its Service is not enough: another user's
pod, or anything else on the cluster network, gets 401 whether or not a NetworkPolicy is
enforced.  This handler is jupyter-server-proxy's ``/proxy/HOST:PORT/`` under
``<base>/tfk8s/tensorboard/HOST:PORT/`` — behind the server's own login (the hub's), limited to
the hosts jupyter-server-proxy allows (``c.ServerProxy.host_allowlist``: the Services of the
user's namespace) — that adds ``Authorization: Bearer <token>`` from the user's token file
(:mod:`tfk8s_magics.tbtokens`) and forwards none of the browser's credentials (its cookies, its
own ``Authorization``) to TensorBoard.
"""

from __future__ import annotations

from .. import tbtokens

#: Request headers that are the browser's credentials for the notebook server, not TensorBoard's.
DROPPED = ("Cookie", "Authorization", "X-XSRFToken")


def add_tensorboard_proxy(web_app, server_app) -> bool:
    """Add the handler; whether it was added (jupyter-server-proxy is installed)."""
    try:
        from jupyter_server.utils import url_path_join
        from jupyter_server_proxy.config import ServerProxy
        from jupyter_server_proxy.handlers import RemoteProxyHandler
    except ImportError:
        return False

    class TensorBoardProxy(RemoteProxyHandler):
        """``/proxy/HOST:PORT/`` with the TensorBoard token of HOST added."""

        def proxy(self, host, port, proxied_path):
            self._tfk8s_host = host
            return super().proxy(host, port, proxied_path)

        async def open(self, host, port, proxied_path):  # noqa: D102 - TensorBoard has no WebSocket
            self._tfk8s_host = host
            return await super().open(host, port, proxied_path)

        def proxy_request_headers(self):  # noqa: D102 - jupyter-server-proxy's hook
            headers = super().proxy_request_headers()
            for name in DROPPED:
                headers.pop(name, None)
            kept = tbtokens.load(getattr(self, "_tfk8s_host", ""))
            if kept is not None:
                headers["Authorization"] = f"Bearer {kept[1]}"
            return headers

    config = ServerProxy(parent=server_app)
    route = url_path_join(web_app.settings["base_url"], r"/tfk8s/tensorboard/([^/:@]+):(\d+)(/.*|)")
    web_app.add_handlers(".*$", [(route, TensorBoardProxy, {
        "absolute_url": False,
        "host_allowlist": config.host_allowlist,
        "rewrite_response": config.non_service_rewrite_response,
    })])
    return True
