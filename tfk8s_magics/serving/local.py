"""Serving on the local backend: the compatible server (:mod:`.server`) as a process.

One serving process per cluster, recorded in ``<cluster dir>/serving.json``
(pid and start time, ports, model), its output in ``serving.log``.  It binds
127.0.0.1, is reached through jupyter-server-proxy like TensorBoard, and exits
with the process that asked for it (the kernel).  The caller may wrap its
command (``wrap``): the local backend runs it behind the owner-only guard, as
TensorBoard.  A start that fails kills it and removes its record: nothing is
left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..errors import BackendError, SpecError
from ..isolation import guard
from ..lifeline import reap_in_background, same_process, start_time
from ..ports import free_ports
from . import MODELS_SUBDIR, ServingInfo
from .models import version_dirs

START_TIMEOUT = 120.0


def models_dir(log_dir: str | Path) -> Path:
    """``<log dir>/models``: where a cluster's Trainer exports its models."""
    return Path(log_dir) / MODELS_SUBDIR


def pick_model(log_dir: str | Path, cluster: str, model: str | None) -> str:
    """The model to serve: the one named, else the cluster's, else the only one exported."""
    root = models_dir(log_dir)
    found = sorted(p.name for p in root.glob("*") if p.is_dir() and version_dirs(p))
    if model is not None:
        if model not in found:
            raise SpecError(
                f"cluster {cluster!r} has no exported model {model!r} under {root} "
                f"(found: {', '.join(found) or 'none'}); give one of those with --model."
            )
        return model
    if cluster in found:
        return cluster
    if len(found) == 1:
        return found[0]
    if not found:
        raise SpecError(
            f"cluster {cluster!r} has exported no model yet (nothing under {root}): train it with "
            "--trainer (the Trainer exports at the end), or save one to "
            f"{root}/{cluster}/1 with tf.saved_model.save."
        )
    raise SpecError(f"cluster {cluster!r} exported several models ({', '.join(found)}): "
                    "choose one with --model.")


def proxied_url(port: int) -> str:
    """The browser's URL of a loopback port: through jupyter-server-proxy when the lab runs it."""
    proxy = os.environ.get("TENSORBOARD_PROXY_URL")
    if proxy:
        return proxy.replace("%PORT%", str(port))
    return f"http://127.0.0.1:{port}/"


def _status(port: int, model: str, timeout: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{model}", timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def _available(doc: dict | None) -> int | None:
    for v in (doc or {}).get("model_version_status", []):
        if v.get("state") == "AVAILABLE":
            return int(v["version"])
    return None


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def _info(cluster: str, rec: dict, reused: bool, version: int | None) -> ServingInfo:
    return ServingInfo(
        cluster=cluster, model=rec["model"], version=version,
        rest_url=proxied_url(rec["rest_port"]), rest_local=f"http://127.0.0.1:{rec['rest_port']}/",
        grpc_address=f"127.0.0.1:{rec['grpc_port']}", base_path=rec["base_path"], reused=reused,
        pid=rec["pid"],
    )


def current(cluster: str, root: Path) -> ServingInfo | None:
    """The serving process of the cluster whose dir is ``root``, if one runs."""
    rec = _read(root / "serving.json")
    if not rec or not same_process(rec.get("pid"), rec.get("start")):
        return None
    return _info(cluster, rec, True, _available(_status(rec["rest_port"], rec["model"])))


def start(cluster: str, root: Path, log_dir: str, model: str | None = None,
          poll_seconds: float = 1.0, timeout: float = START_TIMEOUT,
          ports: tuple[int, int] | None = None,
          wrap: Callable[[list[int], list[str]], list[str]] | None = None) -> ServingInfo:
    """Serve the cluster's newest exported version (reuse a server already serving that model).

    ``ports``: (REST, gRPC), free ones by default; ``wrap(ports, python_args)`` → the command
    that runs ``python PYTHON_ARGS`` (default: this interpreter, as is).
    """
    name = pick_model(log_dir, cluster, model)
    running = current(cluster, root)
    if running is not None and running.model == name:
        return running
    if running is not None:
        stop(root)
    rest, grpc_port = ports or free_ports(2)
    base = str(models_dir(log_dir) / name)
    log_path = root / "serving.log"
    args = ["-m", "tfk8s_magics.serving.server", "--owner", str(os.getpid()),
            "--model-name", name, "--model-base-path", base, "--rest-port", str(rest),
            "--grpc-port", str(grpc_port), "--poll-seconds", str(poll_seconds)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            wrap([rest, grpc_port], args) if wrap else [sys.executable, *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # a kernel interrupt must not reach it
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")},
        )
    rec = {"pid": proc.pid, "start": start_time(proc.pid), "rest_port": rest, "grpc_port": grpc_port,
           "model": name, "base_path": base}
    deadline = time.monotonic() + timeout
    version = None
    while version is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill(proc)
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-10:])
            raise BackendError(
                f"serving {name!r} of cluster {cluster!r} did not become available within {timeout:g} s "
                f"(see {log_path}):\n{tail}"
            )
        version = _available(_status(rest, name, timeout=1.0))
        if version is None:
            time.sleep(0.1)
    (root / "serving.json").write_text(json.dumps(rec), encoding="utf-8")
    reap_in_background(proc)  # stopped later by pid: no zombie under this kernel
    return _info(cluster, rec, False, version)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def stop(root: Path) -> bool:
    """Stop the cluster's serving process and forget it, returning once its ports are closed;
    return whether one was running."""
    rec = _read(root / "serving.json")
    try:
        (root / "serving.json").unlink()
    except FileNotFoundError:
        pass
    ports = [p for p in ((rec or {}).get("rest_port"), (rec or {}).get("grpc_port")) if isinstance(p, int)]
    return guard.stop((rec or {}).get("pid"), (rec or {}).get("start"), ports)
