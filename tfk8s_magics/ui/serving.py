"""Show a served model: endpoint (through jupyter-server-proxy where configured), gRPC address, version."""

from __future__ import annotations

import html

from ..serving import ServingInfo


def serving_text(info: ServingInfo) -> str:
    """One line for terminals and logs."""
    version = info.version if info.version is not None else "loading"
    return (f"{info.cluster}: serving model {info.model!r} version {version} "
            f"({'reused' if info.reused else 'started'}) — REST {info.rest_url}v1/models/{info.model}, "
            f"gRPC {info.grpc_address}")


def serving_html(info: ServingInfo) -> str:
    """The endpoint and model version as HTML (every value escaped; only http(s)/same-origin linked)."""
    e = html.escape
    status_url = f"{info.rest_url.rstrip('/')}/v1/models/{info.model}"
    link = (f'<a href="{e(status_url, quote=True)}" target="_blank" rel="noopener">{e(status_url)}</a>'
            if status_url.startswith(("http://", "https://", "/")) else f"<code>{e(status_url)}</code>")
    version = e(str(info.version)) if info.version is not None else "loading"
    replicas = f" · {info.replicas} replica(s)" if info.replicas != 1 else ""
    return (
        '<div class="tfk8s-serving">'
        f"<b>{e(info.cluster)}</b> serves model <code>{e(info.model)}</code> version <b>{version}</b>"
        f" ({'reused' if info.reused else 'started'}{replicas})<br>"
        f"REST: {link} · <code>POST …/v1/models/{e(info.model)}:predict</code><br>"
        f"gRPC: <code>{e(info.grpc_address)}</code> · models from <code>{e(info.base_path)}</code></div>"
    )


class ServingView:
    """Displays as HTML in a notebook and as one line in a terminal."""

    def __init__(self, info: ServingInfo) -> None:
        self.info = info

    def _repr_html_(self) -> str:
        return serving_html(self.info)

    def __repr__(self) -> str:
        return serving_text(self.info)


def show_serving(info: ServingInfo) -> None:
    """Display ``info`` (HTML in a notebook, a line elsewhere)."""
    from IPython import get_ipython
    from IPython.display import display

    if get_ipython() is None:
        print(serving_text(info))
        return
    display(ServingView(info))
