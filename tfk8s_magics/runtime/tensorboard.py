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
"""

from __future__ import annotations

import io
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


def main() -> None:
    """Start TensorBoard with ``ARGS`` tied to ``OWNER_PID`` (as ``tensorboard ARGS``)."""
    owner = int(sys.argv[1])
    exit_with(owner)
    from absl import app
    from tensorboard import assets, default, main_lib, program
    from tensorboard.plugins import base_plugin

    sys.argv = ["tensorboard", *sys.argv[2:]]
    # What tensorboard.main.run_main does, with the proxy-safe assets.
    main_lib.global_init()
    tb = program.TensorBoard(
        plugins=default.get_plugins(),
        assets_zip_provider=proxy_safe_assets(assets.get_default_assets_zip_provider()),
    )
    try:
        app.run(tb.main, flags_parser=tb.configure)
    except base_plugin.FlagsError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
