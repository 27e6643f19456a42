"""Show a cluster's TensorBoard inline, through jupyter-server-proxy when configured."""

from __future__ import annotations

import html
import os

from ..backends import TensorBoardInfo


def show_tensorboard(info: TensorBoardInfo, height: int = 800) -> None:
    """Display ``info``'s TensorBoard in the notebook.

    With ``TENSORBOARD_PROXY_URL`` set (e.g. ``/user/NAME/proxy/%PORT%/``)
    the iframe goes through jupyter-server-proxy, so it works behind the
    hub; otherwise TensorBoard's own notebook helper points at 127.0.0.1.
    """
    from IPython.display import HTML, display

    if os.environ.get("TENSORBOARD_PROXY_URL") or info.url.startswith("/"):
        url = html.escape(info.url, quote=True)
        display(HTML(
            f'<p>TensorBoard ({"reused" if info.reused else "started"}) for '
            f'<code>{html.escape(info.logdir)}</code>: <a href="{url}" target="_blank">{url}</a></p>'
            f'<iframe class="tfk8s-tensorboard" src="{url}" width="100%" height="{int(height)}" '
            'frameborder="0"></iframe>'
        ))
        return
    from tensorboard import notebook

    print(f"TensorBoard ({'reused' if info.reused else 'started'}) on {info.url} for {info.logdir}")
    notebook.display(port=info.port, height=height)
