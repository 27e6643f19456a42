"""The jupyter_server side of the sidebar: REST under ``/tfk8s/`` and one WebSocket per sidebar.

Every handler authenticates with the server's own rules (token, cookie or the hub's OAuth),
asks the server's authorizer (resource ``tfk8s``), and checks XSRF on every request that
changes something (tornado does it for POST/DELETE; JupyterLab's ``ServerConnection`` sends
the token).  Everything a handler does to a cluster is one call of the public API
(:mod:`tfk8s_magics.api`), run in a worker thread so the server's loop never blocks.

WebSocket ``/tfk8s/stream`` messages, server → browser: ``snapshot`` (every row, on connect),
``cluster`` (one row changed), ``removed``, ``error``, ``logs`` (lines of a followed
cluster) and ``logs_end``; browser → server: ``follow`` / ``unfollow`` a cluster's logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import ensure_async
from tornado import web, websocket
from tornado.ioloop import IOLoop

from .. import api, options
from ..errors import ClusterExists, ClusterNotFound, SpecError, TaskNotFound, TFClusterError
from .form import form_fields, parse_form
from .monitor import ClusterMonitor
from .rows import cluster_row, event_row

log = logging.getLogger(__name__)

AUTH_RESOURCE = "tfk8s"
#: Mistakes in what the user asked for: 400, the error's sentence shown as it is.
_USAGE = (SpecError, ClusterExists, TaskNotFound)


def _monitor(handler: JupyterHandler) -> ClusterMonitor:
    return handler.settings["tfk8s_monitor"]


class _Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    async def _authorize(self, action: str) -> None:
        ok = await ensure_async(self.authorizer.is_authorized(self, self.current_user, action,
                                                              AUTH_RESOURCE))
        if not ok:
            raise web.HTTPError(403, f"not allowed to {action} tfk8s clusters")

    def _fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish(json.dumps({"message": message}))

    async def _call(self, fn, *args, **kwargs) -> tuple[bool, Any]:
        """Run a blocking API call in a thread; a TFClusterError becomes the response's sentence."""
        try:
            return True, await asyncio.to_thread(fn, *args, **kwargs)
        except ClusterNotFound as e:
            self._fail(404, str(e))
        except _USAGE as e:
            self._fail(400, str(e))
        except TFClusterError as e:
            self._fail(500, str(e))
        return False, None


class ClustersHandler(_Base):
    """``GET``: every row; ``POST``: launch from the form ``{name, script, options}``."""

    @web.authenticated
    async def get(self) -> None:
        """Every row (the sidebar's first view before its socket opens)."""
        await self._authorize("read")
        mon = _monitor(self)
        self.finish(json.dumps({"backend": options.get("backend", mon.backend), "error": mon.error,
                                "clusters": mon.snapshot()}))

    @web.authenticated
    async def post(self) -> None:
        """Launch from the form, detached; the row comes back (201) or the one sentence (400)."""
        await self._authorize("execute")
        body = self.get_json_body() or {}
        script = str(body.get("script") or "")
        try:
            path = self._script_path(script)
            args = parse_form(str(body.get("name") or ""), path, body.get("options") or {})
        except SpecError as e:
            self._fail(400, str(e))
            return
        ok, row = await self._call(_launch, args)
        if ok:
            _monitor(self).launched(row)
            self.set_status(201)
            self.finish(json.dumps({"cluster": row}))

    def _script_path(self, script: str) -> str:
        """The chosen file as an absolute path, refused unless it lies under the server's root."""
        if not script.strip():
            raise SpecError("no training script chosen: pick a .py file in the file browser.")
        root = Path(os.path.expanduser(self.settings.get("server_root_dir") or os.getcwd())).resolve()
        path = (root / script.lstrip("/")).resolve()
        if not path.is_relative_to(root):
            raise SpecError(f"the script {script!r} is outside the server's root {root}: pick a file "
                            "in the file browser.")
        return str(path)


def _launch(args) -> dict[str, Any]:
    """What ``tfk8s launch`` does with the same arguments, detached (the server is not its owner)."""
    spec = api.make_spec(args.name, **{o.name: getattr(args, o.name) for o in options.spec_options()})
    # The server never connects to an in-graph cluster: no TensorFlow import in its process.
    cluster = api.launch(spec, backend=args.backend, detach=True, replace=args.replace, force=args.force,
                         prepare_client=False)
    return cluster_row(cluster.status(), time.time())


class FormHandler(_Base):
    """``GET``: the launch form's fields, from the options registry."""

    @web.authenticated
    async def get(self) -> None:
        """The form's fields with the current defaults."""
        await self._authorize("read")
        try:
            fields = form_fields()
        except SpecError as e:  # a broken TFK8S_* environment variable
            self._fail(500, str(e))
            return
        self.finish(json.dumps({"fields": fields}))


class ClusterHandler(_Base):
    """``DELETE``: delete a cluster (and its logs, as ``%tfcluster delete`` does)."""

    @web.authenticated
    async def delete(self, name: str) -> None:
        """Delete cluster ``name`` (204)."""
        await self._authorize("write")
        mon = _monitor(self)
        ok, _ = await self._call(lambda: api.get(name, mon.backend).delete())
        if ok:
            mon.refresh()
            self.set_status(204)
            self.finish()


class ActionHandler(_Base):
    """``POST /tfk8s/clusters/NAME/(stop|tensorboard|serve)``; ``GET .../events``."""

    @web.authenticated
    async def get(self, name: str, action: str) -> None:
        """The cluster's events, oldest first."""
        await self._authorize("read")
        if action != "events":
            raise web.HTTPError(404)
        backend = _monitor(self).backend
        ok, events = await self._call(lambda: api.get(name, backend).events())
        if ok:
            self.finish(json.dumps({"events": [event_row(e) for e in events]}))

    @web.authenticated
    async def post(self, name: str, action: str) -> None:
        """Stop it, start (or reuse) its TensorBoard, or serve its newest model."""
        await self._authorize("write")
        mon = _monitor(self)
        if action == "stop":
            ok, st = await self._call(lambda: api.get(name, mon.backend).stop())
            if ok:
                mon.refresh()
                self.finish(json.dumps({"cluster": cluster_row(st, time.time())}))
        elif action == "tensorboard":
            ok, info = await self._call(lambda: api.get(name, mon.backend).tensorboard())
            if ok:
                self.finish(json.dumps({"port": info.port, "url": info.url, "reused": info.reused,
                                        "local": _is_loopback(info.url)}))
        elif action == "serve":
            ok, info = await self._call(lambda: api.get(name, mon.backend).serve())
            if ok:
                self.finish(json.dumps({"text": str(info)}))
        else:
            raise web.HTTPError(404)


def _is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


class StreamHandler(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):
    """The push channel of one sidebar: cluster rows, and the logs it follows."""

    auth_resource = AUTH_RESOURCE

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Authenticate and authorize before the upgrade: a refused socket never opens."""
        ok = await ensure_async(self.authorizer.is_authorized(self, self.current_user, "read",
                                                              AUTH_RESOURCE))
        if not ok:
            raise web.HTTPError(403, "not allowed to read tfk8s clusters")
        res = super().get(*args, **kwargs)
        if res is not None:
            await res

    def open(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102 - tornado's hook
        self._loop = IOLoop.current()
        self._follows: dict[str, threading.Event] = {}
        mon = _monitor(self)
        self._unsubscribe = mon.subscribe(self._from_thread)
        self._send({"type": "snapshot", "backend": options.get("backend", mon.backend), "error": mon.error,
                    "clusters": mon.snapshot()})

    def on_message(self, message: str | bytes) -> None:  # noqa: D102 - tornado's hook
        try:
            msg = json.loads(message)
            kind, fid = msg["type"], str(msg["id"])
        except (ValueError, KeyError, TypeError):
            self._send({"type": "error", "message": f"not a message of the sidebar: {str(message)[:80]!r}"})
            return
        if kind == "follow":
            self._follow(fid, str(msg.get("name", "")))
        elif kind == "unfollow":
            ev = self._follows.pop(fid, None)
            if ev is not None:
                ev.set()

    def on_close(self) -> None:  # noqa: D102 - tornado's hook
        self._unsubscribe()
        for ev in self._follows.values():
            ev.set()
        self._follows.clear()

    # -- sending -----------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        if self.ws_connection is None or self.ws_connection.is_closing():
            return
        self.write_message(json.dumps(msg))

    def _from_thread(self, msg: dict[str, Any]) -> None:
        self._loop.add_callback(self._send, msg)

    # -- logs --------------------------------------------------------------
    def _follow(self, fid: str, name: str) -> None:
        if fid in self._follows:
            return
        stop = self._follows[fid] = threading.Event()
        threading.Thread(target=self._run_follow, args=(fid, name, stop), daemon=True,
                         name=f"tfk8s-sidebar-logs-{name}").start()

    def _run_follow(self, fid: str, name: str, stop: threading.Event) -> None:
        """Send a cluster's log lines, its kept log first, then each line as its task prints it.
        A line read while no batch is on its way goes out at once; lines read meanwhile join
        the next batch (one message per loop turn, not per line)."""
        pending: list[list] = []
        lock = threading.Lock()

        def flush() -> None:
            with lock:
                batch = pending[:]
                pending.clear()
            if batch and not stop.is_set():
                self._send({"type": "logs", "id": fid, "lines": batch})

        def add(items: list[list]) -> None:
            with lock:
                first = not pending
                pending.extend(items)
            if first:
                self._loop.add_callback(flush)

        try:
            cluster = api.get(name, _monitor(self).backend)
            for line in cluster.follow(stop, from_start=True):
                add([[line.task, line.text, line.time]])
        except TFClusterError as e:
            self._loop.add_callback(self._send, {"type": "error", "id": fid, "message": str(e)})
        except Exception as e:  # noqa: BLE001 - the tab says so; the server goes on
            log.exception("tfk8s sidebar: following %s failed", name)
            self._loop.add_callback(self._send, {"type": "error", "id": fid, "message": str(e)})
        self._loop.add_callback(flush)
        self._loop.add_callback(self._send, {"type": "logs_end", "id": fid})
