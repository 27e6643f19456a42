"""A local TensorFlow-Serving-compatible server: ``python -m tfk8s_magics.serving.server ...``.

It loads the newest SavedModel under ``--model-base-path`` with TensorFlow,
answers TensorFlow Serving's REST API (:mod:`.rest`) and gRPC API
(:mod:`.grpc_api`) on 127.0.0.1 only, polls the base path for new versions
like TensorFlow Serving does, and exits when its owner (``--owner PID``,
the notebook kernel) exits.  It is a compatible endpoint, not the
``tensorflow_model_server`` binary (which no reachable registry ships).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..lifeline import exit_with
from .grpc_api import start_grpc
from .models import Model, Models
from .rest import handle

#: Largest request body accepted (bytes): a predict request, not an upload.
MAX_BODY = 64 * 1024 * 1024


def make_handler(models: Models) -> type[BaseHTTPRequestHandler]:
    """A request handler class answering the REST API from ``models``."""

    class Handler(BaseHTTPRequestHandler):
        """GET model status, POST predict; JSON in, JSON out."""

        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
        # Headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms.
        disable_nagle_algorithm = True

        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                status, doc = 413, {"error": f"request body of {length} bytes is over {MAX_BODY}"}
                self.close_connection = True
            else:
                body = self.rfile.read(length) if length else b""
                status, doc = handle(models, method, self.path, body)
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's method name
            """Model status."""
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802 - http.server's method name
            """Predict."""
            self._answer("POST")

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - base class signature
            """Errors only: a line per request would drown the log."""

    return Handler


class ServingServer:
    """REST + gRPC servers over one set of models, on 127.0.0.1."""

    def __init__(self, models: Models, rest_port: int, grpc_port: int | None,
                 host: str = "127.0.0.1", poll_seconds: float = 1.0) -> None:
        self.models = models
        self.http = ThreadingHTTPServer((host, rest_port), make_handler(models))
        self.http.daemon_threads = True
        self.grpc = None
        if grpc_port is not None:
            self.grpc = start_grpc(models, f"{host}:{grpc_port}")
        self._stop_polling = models.start_polling(poll_seconds)
        self._thread: threading.Thread | None = None

    @property
    def rest_port(self) -> int:
        """The port the REST API listens on."""
        return self.http.server_address[1]

    def start(self) -> ServingServer:
        """Serve REST in a daemon thread (gRPC serves in its own pool)."""
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True, name="rest")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop polling and both servers."""
        self._stop_polling.set()
        self.http.shutdown()
        self.http.server_close()
        if self.grpc is not None:
            self.grpc.stop(grace=None)


def main(argv: list[str] | None = None) -> int:
    """Run until killed or until the owner exits."""
    p = argparse.ArgumentParser(prog="tfk8s-serving", description=__doc__.splitlines()[0])
    p.add_argument("--model-name", required=True)
    p.add_argument("--model-base-path", required=True)
    p.add_argument("--rest-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, default=None)
    p.add_argument("--poll-seconds", type=float, default=1.0,
                   help="how often the base path is scanned for new versions (TF Serving: "
                   "--file_system_poll_wait_seconds)")
    p.add_argument("--owner", type=int, default=0, help="exit when this process exits")
    args = p.parse_args(argv)
    if args.owner:
        exit_with(args.owner)
    model = Model(args.model_name, args.model_base_path)
    model.refresh()
    server = ServingServer(Models({args.model_name: model}), args.rest_port, args.grpc_port,
                           poll_seconds=args.poll_seconds).start()
    print(f"tfk8s-serving: model {args.model_name!r} version {model.serving_version} from "
          f"{args.model_base_path}; REST 127.0.0.1:{server.rest_port}, gRPC 127.0.0.1:{args.grpc_port} "
          f"(pid {os.getpid()})", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
