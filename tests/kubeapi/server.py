"""HTTP transport of the fake Kubernetes API server (a TEST DOUBLE).

A ``ThreadingHTTPServer`` on 127.0.0.1 speaking HTTP/1.1 with keep-alive (the
official client pools connections). Plain answers carry Content-Length;
watches and ``follow=true`` logs are sent with chunked transfer encoding,
one JSON line (or log lines) per chunk, like the real apiserver.

Shutdown is deliberate about threads: every accepted socket is tracked and
shut down on :meth:`FakeKubeServer.stop`, so handler threads blocked on an
idle keep-alive connection exit, and ``server_close`` joins them all.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from .api import KubeAPI, Request, Response


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kubeapi-test-double"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle plus
    # the client's delayed ACK add ~40 ms to every request.
    disable_nagle_algorithm = True
    # Idle keep-alive connections are dropped after this long (safety net only;
    # stop() closes them at once).
    timeout = 60

    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        """Silence per-request logging; tests read ``harness.requests`` instead."""

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        auth = self.headers.get("Authorization") or ""
        token = auth[7:] if auth.lower().startswith("bearer ") else None
        req = Request(self.command, url.path, dict(parse_qsl(url.query, keep_blank_values=True)),
                      body, self.headers.get("Content-Type") or "", token,
                      accept=self.headers.get("Accept") or "")
        response = self.server.api.handle(req)
        if response.stream is not None:
            self._send_stream(response)
        else:
            self._send(response)

    def _send(self, response: Response) -> None:
        if isinstance(response.body, bytes | str):
            data = response.body.encode() if isinstance(response.body, str) else response.body
        else:
            data = json.dumps(response.body).encode()
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, response: Response) -> None:
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        stream = response.stream
        try:
            for chunk in stream:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            # The client went away (Watch.stop() shuts its socket down).
            self.close_connection = True
        finally:
            stream.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close(): no leaked threads
    block_on_close = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up on a watch or a followed log is normal, as on a real server.
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, api: KubeAPI):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api
        self._sockets: set[socket.socket] = set()
        self._sockets_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._conn_threads: list[threading.Thread] = []

    def process_request(self, request, client_address):
        with self._sockets_lock:
            self._sockets.add(request)
        t = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             name=f"kubeapi-conn-{next(self._ids)}")
        t.daemon = False
        self._conn_threads = [c for c in self._conn_threads if c.is_alive()] + [t]
        t.start()

    def server_close(self):
        super().server_close()
        for t in self._conn_threads:
            t.join(timeout=10)

    def shutdown_request(self, request):
        with self._sockets_lock:
            self._sockets.discard(request)
        super().shutdown_request(request)

    def close_client_sockets(self) -> None:
        """Unblock handler threads waiting on idle keep-alive connections."""
        with self._sockets_lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class FakeKubeServer:
    """Runs :class:`KubeAPI` over HTTP on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, api: KubeAPI):
        self.api = api
        self._httpd = _Server(api)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, name="kubeapi-server")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Start accepting connections."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, end streams, close connections, and join every thread."""
        self.api.stopping.set()
        self.api.store.close()
        self._httpd.shutdown()
        self._thread.join(timeout=10)
        self._httpd.close_client_sockets()
        self._httpd.server_close()  # joins the per-connection threads
