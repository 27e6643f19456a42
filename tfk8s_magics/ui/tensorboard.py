"""Show a cluster's TensorBoard inline, through jupyter-server-proxy when configured."""

from __future__ import annotations

import html
import os

from ..backends import TensorBoardInfo


def tensorboard_html(url: str, logdir: str, reused: bool, height: int = 600) -> str:
    """A link to TensorBoard and an iframe of it (only http(s) or same-origin URLs are linked)."""
    e = html.escape
    head = (
        f'<div class="tfk8s-tensorboard">TensorBoard ({"reused" if reused else "started"}) '
        f"on <code>{e(logdir)}</code>: "
    )
    if not url.startswith(("http://", "https://", "/")):
        return head + f"<code>{e(url)}</code></div>"
    u = e(url, quote=True)
    return (
        head + f'<a href="{u}" target="_blank" rel="noopener">{e(url)}</a>'
        f'<iframe src="{u}" width="100%" height="{int(height)}" frameborder="0"></iframe></div>'
    )


def show_tensorboard(info: TensorBoardInfo, height: int = 800) -> None:
    """Display ``info``'s TensorBoard in the notebook.

    With ``TENSORBOARD_PROXY_URL`` set (e.g. ``/user/NAME/proxy/%PORT%/``)
    the iframe goes through jupyter-server-proxy, so it works behind the
    hub; otherwise TensorBoard's own notebook helper points at 127.0.0.1.
    """
    from IPython.display import HTML, display

    if os.environ.get("TENSORBOARD_PROXY_URL") or info.url.startswith("/"):
        display(HTML(tensorboard_html(info.url, info.logdir, info.reused, height)))
        return
    from tensorboard import notebook

    print(f"TensorBoard ({'reused' if info.reused else 'started'}) on {info.url} for {info.logdir}")
    notebook.display(port=info.port, height=height)
