"""The servers beside a local cluster: its TensorBoard and its model server.

Both run behind the owner-only guard (:mod:`~tfk8s_magics.isolation.guard`: their own network
namespace and the relay, so only the cluster's owner reaches them), on ports free on the host too
(:mod:`~tfk8s_magics.isolation.hostside`), and both end with the cluster's deletion.  Serving
itself is :mod:`tfk8s_magics.serving.local`; this module starts it for a cluster (from its log
dir, or from object storage with ``--from``).
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import time
from pathlib import Path

from ... import storage
from ...errors import BackendError, SpecError
from ...isolation import guard, hostside
from ...lifeline import reap_in_background, same_process, start_time
from ...ports import port_open
from ...serving import local as local_serving
from ..base import TensorBoardInfo
from . import logtail
from .layout import ClusterDir, UnreadableState, read_json, read_mapping, write_json_atomic

#: Seconds a new TensorBoard gets to answer.
TENSORBOARD_START_TIMEOUT = 90.0


def tensorboard(name: str, cdir: ClusterDir, record: dict) -> TensorBoardInfo:
    """The TensorBoard of cluster ``name`` (dir ``cdir``, record ``record``): the one running, or a
    new one on a free port behind the owner-only guard, waited for until it answers."""
    info = _tb_info(cdir)
    if info and same_process(info.get("pid"), info.get("start")) and port_open(info["port"]):
        return TensorBoardInfo(info["port"], _tb_url(info["port"]), record["log_dir"], True, info["pid"])
    port = hostside.free_port()  # in a sandboxed kernel: free on the host too
    proc = subprocess.Popen(
        # The guard makes it answer the owner only (its own namespace + the relay).
        guard.command([port], str(cdir.root), [
            "-m", "tfk8s_magics.runtime.tensorboard", str(os.getpid()),
            "--logdir", record["log_dir"], "--host", "127.0.0.1", "--port", str(port),
        ]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(cdir.root / "tensorboard.log", "ab"),  # noqa: SIM115 - the child owns it
        start_new_session=True,
    )
    deadline = time.monotonic() + TENSORBOARD_START_TIMEOUT
    while not _http_answers(port):  # not port_open: the guard's relay listens before TensorBoard
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            tail = "\n".join(logtail.tail_lines(cdir.root / "tensorboard.log", 10))
            raise BackendError(
                f"TensorBoard for {name!r} did not start (see {cdir.root / 'tensorboard.log'}):\n{tail}"
            )
        time.sleep(0.05)
    write_json_atomic(cdir.tensorboard, {"pid": proc.pid, "start": start_time(proc.pid), "port": port})
    reap_in_background(proc)  # stopped later by pid: no zombie under this kernel
    return TensorBoardInfo(port, _tb_url(port), record["log_dir"], False, proc.pid)


def stop_tensorboard(cdir: ClusterDir) -> None:
    """End the cluster's TensorBoard, if it runs (SIGTERM, then SIGKILL after 5 s), and return once
    its port is closed."""
    info = _tb_info(cdir)
    if info:
        guard.stop(info.get("pid"), info.get("start"), [info["port"]])

# -- serving (see tfk8s_magics.serving.local) -------------------------------
def serve(name: str, cdir: ClusterDir, model: str | None = None, source_url: str | None = None, **options):
    """Serve the cluster's newest exported model with the local TF-Serving-compatible server.

    ``replicas``/``cpu``/``memory`` are Kubernetes choices: one process serves here.
    ``source_url``: serve from object storage instead of the log dir (see :func:`_fetch_models`).
    ``options`` hold no ``credentials_secret``: the caller refused it (:func:`refuse_secret`)
    before looking the cluster up.
    """
    if source_url is not None:
        base = _fetch_models(cdir, source_url)
        local_serving.stop(cdir.root)
        kwargs = {k: v for k, v in options.items() if k in ("poll_seconds", "timeout")}
        return local_serving.start(name, cdir.root, str(base), model, **kwargs, **_guarded(cdir))
    allowed = {"poll_seconds", "timeout"}
    for key, value in options.items():
        if key not in allowed and value not in (None, 1):
            raise SpecError(f"--{key.replace('_', '-')} applies to Kubernetes serving; "
                            "the local backend runs one server process.")
    kwargs = {k: v for k, v in options.items() if k in allowed}
    return local_serving.start(name, cdir.root, read_json(cdir.record)["log_dir"], model, **kwargs,
                         **_guarded(cdir))


def refuse_secret(options: dict) -> None:
    """Take ``credentials_secret`` out of serving ``options``; refuse it in one sentence when set
    (checked before the cluster is looked up: the flag is wrong whatever the cluster)."""
    secret = options.pop("credentials_secret", None)
    if secret:
        raise SpecError(f"--credentials-secret {secret!r} names a Kubernetes Secret; the local backend "
                        "reads storage credentials from your environment or fsspec's config: drop it.")


def serving(name: str, cdir: ClusterDir):
    """The model this cluster serves, or None."""
    return local_serving.current(name, cdir.root)



def stop_serving(cdir: ClusterDir) -> bool:
    """Stop serving the cluster's model; return whether a server was running."""
    return local_serving.stop(cdir.root)


def _guarded(cdir: ClusterDir) -> dict:
    """How a model server starts here: behind the owner-only guard, as TensorBoard (its own
    network namespace + the relay; in a sandboxed kernel also on the host's loopback, for
    jupyter-server-proxy), on two ports free on both sides."""
    rest = hostside.free_port()
    grpc_port = hostside.free_port()
    while grpc_port == rest:
        grpc_port = hostside.free_port()
    return {"ports": (rest, grpc_port),
            "wrap": lambda ports, args: guard.command(ports, str(cdir.root), args)}


def _fetch_models(cdir: ClusterDir, url: str) -> Path:
    """Copy the models under ``url`` (a ``--backup`` URL: its ``models/``; else ``url`` is a models dir,
    ``<model>/<version>/``) to ``<cluster dir>/served/models``; return ``served`` (a log dir to serve
    from).  The copy replaces the previous one only once it is complete."""
    storage.check_url("--from", url)
    served = cdir.root / "served"
    fresh = cdir.root / ".served-new"
    shutil.rmtree(fresh, ignore_errors=True)
    try:
        storage.fetch_models(url, fresh / "models")
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    shutil.rmtree(served, ignore_errors=True)
    os.replace(fresh, served)
    return served


def _tb_info(cdir: ClusterDir) -> dict | None:
    try:
        info = read_mapping(cdir.tensorboard)
    except UnreadableState:
        return None
    ok = info is not None and all(isinstance(info.get(k), int) and not isinstance(info.get(k), bool)
                                  for k in ("pid", "port"))
    return info if ok and 0 < info["port"] < 65536 else None


def _http_answers(port: int) -> bool:
    """Whether an HTTP server answers on ``127.0.0.1:port`` (no proxy settings apply)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/data/logdir")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _tb_url(port: int) -> str:
    proxy = os.environ.get("TENSORBOARD_PROXY_URL")
    if proxy:
        return proxy.replace("%PORT%", str(port))
    return f"http://127.0.0.1:{port}/"
