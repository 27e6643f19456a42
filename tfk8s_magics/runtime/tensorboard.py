"""Run TensorBoard for as long as its owner lives, with fonts that load behind a proxy.

``python -m tfk8s_magics.runtime.tensorboard OWNER_PID ARGS...``

The owner is the process (the notebook kernel) that asked for it; when the
owner exits, so does this TensorBoard.

TensorBoard's ``index.html`` asks for its Roboto fonts at the site root
(``url(/font-roboto/….woff2)``).  Behind JupyterHub the page lives under
``/user/NAME/proxy/PORT/``, so those requests reach the hub (which
redirects them to ``/hub/font-roboto/…``: 404).  This runner serves the
same assets with those URLs made relative to the page
(``url(font-roboto/…)``), which TensorBoard itself serves; everything else
is TensorBoard's own ``main``.

On Kubernetes (``OWNER_PID`` 0: no owner process) TensorBoard is a Deployment that any pod of the
cluster network could reach: with ``$TFK8S_TENSORBOARD_TOKEN`` set (from the cluster's Secret) it
answers only requests carrying ``Authorization: Bearer <token>``, which its owner's notebook
server adds (:mod:`tfk8s_magics.sidebar.tbproxy`); another user's request is refused with 401
whether or not a NetworkPolicy is enforced.  :data:`READY_PATH` answers without it, for the
readiness probe.
"""

from __future__ import annotations

import hmac
import io
import os
import sys
import zipfile

from ..lifeline import exit_with

#: What TensorBoard's index.html writes, and what it should write to work under any prefix.
ROOT_FONTS = b"url(/font-roboto/"
RELATIVE_FONTS = b"url(font-roboto/"


def relative_fonts(index_html: bytes) -> bytes:
    """``index_html`` with its root-absolute font URLs made relative to the page."""
    return index_html.replace(ROOT_FONTS, RELATIVE_FONTS)


def proxy_safe_assets(provider):
    """An assets provider like TensorBoard's ``provider``, with :func:`relative_fonts` applied.

    The rewritten archive is built once, in memory, the first time it is asked for.
    """
    built: list[bytes] = []

    def open_assets():
        if not built:
            out = io.BytesIO()
            with provider() as fp, zipfile.ZipFile(fp) as src:
                with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
                    for item in src.infolist():
                        data = src.read(item)
                        if item.filename == "index.html":
                            data = relative_fonts(data)
                        dst.writestr(item, data)
            built.append(out.getvalue())
        return io.BytesIO(built[0])

    return open_assets


#: Where the token is read from (the Kubernetes Deployment sets it from a Secret).
TOKEN_ENV = "TFK8S_TENSORBOARD_TOKEN"
#: The one path answered without the token: the readiness probe's (it says only "ready").
READY_PATH = "/tfk8s-ready"
REFUSAL = b"This TensorBoard answers only through its owner's notebook server.\n"


def require_token(app, token: str):
    """A WSGI app that passes to ``app`` only requests carrying ``Authorization: Bearer token``."""
    expected = f"Bearer {token}".encode()

    def guarded(environ, start_response):
        if environ.get("PATH_INFO") == READY_PATH:
            start_response("200 OK", [("Content-Type", "text/plain"), ("Cache-Control", "no-store")])
            return [b"ready\n"]
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                                ("WWW-Authenticate", 'Bearer realm="tfk8s-tensorboard"')])
            return [REFUSAL]
        return app(environ, start_response)

    return guarded


def main() -> None:
    """Start TensorBoard with ``ARGS`` tied to ``OWNER_PID`` (as ``tensorboard ARGS``; 0: no owner)."""
    owner = int(sys.argv[1])
    if owner:
        exit_with(owner)
    token = os.environ.pop(TOKEN_ENV, "")
    from absl import app
    from tensorboard import assets, default, main_lib, program
    from tensorboard.plugins import base_plugin

    sys.argv = ["tensorboard", *sys.argv[2:]]
    # What tensorboard.main.run_main does, with the proxy-safe assets.
    main_lib.global_init()
    server_class = None
    if token:
        def server_class(wsgi_app, flags):
            return program.WerkzeugServer(require_token(wsgi_app, token), flags)
    tb = program.TensorBoard(
        plugins=default.get_plugins(),
        assets_zip_provider=proxy_safe_assets(assets.get_default_assets_zip_provider()),
        server_class=server_class,
    )
    try:
        app.run(tb.main, flags_parser=tb.configure)
    except base_plugin.FlagsError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
