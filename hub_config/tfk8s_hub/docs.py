"""The lab's documentation as a hub-managed service: the built manual, read-only, on 127.0.0.1.

``scripts/docs build`` writes the manual to ``build/docs/html``; when it is there, the local
profile adds this service (:func:`docs_service`) and the login page links to it
(``/services/docs/``). JupyterHub starts the process with ``JUPYTERHUB_SERVICE_URL`` (where to
listen) and ``JUPYTERHUB_SERVICE_PREFIX`` (the proxy forwards the whole path) in its
environment; it serves the files of that one directory under the prefix and nothing else, and
ends with the hub. The pages need no login, like any project's documentation.
"""

from __future__ import annotations

import functools
import html
import http.server
import os
import posixpath
import sys
import urllib.parse
from pathlib import Path
from typing import Any

#: The service's name: the manual is at ``<base_url>services/docs/``.
NAME = "docs"


def docs_service(docs_dir: Path, port: int) -> dict[str, Any] | None:
    """The hub-managed service serving ``docs_dir`` on ``127.0.0.1:port`` (None when not built)."""
    if not (docs_dir / "index.html").is_file():
        return None
    return {
        "name": NAME,
        "url": f"http://127.0.0.1:{port}",
        "command": [sys.executable, "-m", "tfk8s_hub.docs", str(docs_dir)],
        "environment": {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        "display": True,
    }


def docs_link(base_url: str = "/") -> str:
    """The login page's sentence that links to the manual (HTML)."""
    href = html.escape(f"{base_url.rstrip('/')}/services/{NAME}/", quote=True)
    return f' <span class="tfk8s-docs-link">The manual: <a href="{href}">tfk8s-lab documentation</a>.</span>'


class Handler(http.server.SimpleHTTPRequestHandler):
    """Files of one directory under one URL prefix; a path outside the prefix is not found."""

    prefix = "/"

    def _inside(self) -> bool:
        url = urllib.parse.urlsplit(self.path).path
        return url.startswith(self.prefix) or url + "/" == self.prefix

    def send_head(self):
        """404 for a path outside the prefix; else the file (or a directory's redirect)."""
        if not self._inside():
            self.send_error(404, "Not Found")
            return None
        return super().send_head()

    def translate_path(self, path: str) -> str:
        """The file for ``path`` with the prefix stripped (``..`` cannot leave the directory)."""
        url = urllib.parse.urlsplit(path).path
        return super().translate_path("/" + url[len(self.prefix):])

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Quiet: the hub's own log has the requests."""


def serve(docs_dir: Path, service_url: str, prefix: str) -> None:
    """Serve ``docs_dir`` at ``service_url`` (its host must be 127.0.0.1) under ``prefix``."""
    url = urllib.parse.urlsplit(service_url)
    if url.hostname != "127.0.0.1" or not url.port:
        raise SystemExit(f"tfk8s docs: refusing to listen on {service_url!r}: only 127.0.0.1:PORT.")
    handler = type("DocsHandler", (Handler,), {"prefix": posixpath.join(prefix, "")})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", url.port), functools.partial(handler, directory=str(docs_dir)))
    with server:
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """``python -m tfk8s_hub.docs DIR``, as JupyterHub starts it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0], "index.html").is_file():
        raise SystemExit("usage: python -m tfk8s_hub.docs DIR (a built manual: scripts/docs build)")
    serve(Path(args[0]), os.environ.get("JUPYTERHUB_SERVICE_URL", ""),
          os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/docs/"))


if __name__ == "__main__":
    main()
