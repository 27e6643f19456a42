"""The models a serving process holds: versions found under a base path, loaded with TensorFlow.

TensorFlow Serving's layout and policy, reproduced: a model's *base path*
holds one directory per version, named by a whole number
(``<base>/1/saved_model.pb``, ``<base>/2/…``); the newest version is served
(the "latest 1" version policy), and the base path is polled so that a
version exported later is picked up without a restart.  A version that fails
to load is reported with its error, and the last good one stays served.

Errors carry TensorFlow Serving's own wording and status code
(:class:`ServingError`), so the REST and gRPC front ends report them as
TensorFlow Serving does.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: TensorFlow Serving's state names (``ModelVersionStatus.State``).
START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"
DEFAULT_SIGNATURE = "serving_default"


class ServingError(Exception):
    """An error with a gRPC status code name (``NOT_FOUND``, ``INVALID_ARGUMENT``, …)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: gRPC code → HTTP status, as TensorFlow Serving's http_server.cc maps them.
HTTP_STATUS = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501,
    "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401,
}


def version_dirs(base_path: str | os.PathLike) -> dict[int, Path]:
    """The complete versions under ``base_path``: whole-number dirs holding a ``saved_model.pb``.

    A version being written (no ``saved_model.pb`` yet) is not listed, so a
    poll never loads half an export.
    """
    out: dict[int, Path] = {}
    try:
        entries = list(os.scandir(base_path))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for entry in entries:
        if entry.is_dir() and entry.name.isdigit() and (Path(entry.path) / "saved_model.pb").exists():
            out[int(entry.name)] = Path(entry.path)
    return out


@dataclass
class Version:
    """One version of a model: its state and, once loaded, the TensorFlow object."""

    number: int
    path: Path
    state: str = START
    error: str = ""
    loaded: Any = None
    signatures: dict[str, Any] = field(default_factory=dict)


class Model:
    """One served model: ``name`` and its versions under ``base_path``."""

    def __init__(self, name: str, base_path: str | os.PathLike) -> None:
        self.name = name
        self.base_path = Path(base_path)
        self.versions: dict[int, Version] = {}
        self._lock = threading.Lock()
        self._serving: Version | None = None

    # -- loading ---------------------------------------------------------------
    def refresh(self) -> bool:
        """Load the newest complete version if it is new; return whether anything changed."""
        found = version_dirs(self.base_path)
        if not found:
            return False
        newest = max(found)
        with self._lock:
            if newest in self.versions:
                return False
            version = Version(newest, found[newest], LOADING)
            self.versions[newest] = version
        try:
            import tensorflow as tf

            obj = tf.saved_model.load(str(version.path))
            signatures = dict(obj.signatures)
        except Exception as e:  # noqa: BLE001 - a bad export is reported, not fatal
            with self._lock:
                version.state, version.error = END, f"{type(e).__name__}: {e}"
            return True
        with self._lock:
            version.loaded, version.signatures, version.state = obj, signatures, AVAILABLE
            old, self._serving = self._serving, version
            if old is not None:
                # Latest-1 policy: the previous version is unloaded once the new one serves.
                old.state, old.loaded, old.signatures = END, None, {}
        return True

    def poll(self, stop: threading.Event, interval: float) -> None:
        """Refresh every ``interval`` seconds until ``stop`` is set (TF Serving's file-system poll)."""
        while not stop.wait(interval):
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - keep polling; the next export may be fine
                print(f"tfk8s-serving: polling {self.base_path} failed: {e}", flush=True)

    # -- lookups ---------------------------------------------------------------
    def servable(self, version: int | None) -> Version:
        """The loaded version asked for (the newest when ``version`` is None), or NOT_FOUND."""
        with self._lock:
            if version is None:
                found = self._serving
                what = f"Latest({self.name})"
            else:
                v = self.versions.get(version)
                found = v if v is not None and v.state == AVAILABLE else None
                what = f"Specific({self.name}, {version})"
        if found is None:
            raise ServingError("NOT_FOUND", f"Servable not found for request: {what}")
        return found

    def status(self, version: int | None) -> list[Version]:
        """Versions for the model-status API, newest first (TF Serving's NOT_FOUND wording)."""
        with self._lock:
            if version is not None:
                if version not in self.versions:
                    raise ServingError("NOT_FOUND", f"Could not find version {version} of model {self.name}")
                return [self.versions[version]]
            if not self.versions:
                raise ServingError("NOT_FOUND", f"Could not find any versions of model {self.name}")
            return [self.versions[v] for v in sorted(self.versions, reverse=True)]

    @property
    def serving_version(self) -> int | None:
        """The version answering requests without a version, if any."""
        v = self._serving
        return v.number if v is not None else None


class Models:
    """Every model a server holds, by name; unknown names get TF Serving's NOT_FOUND."""

    def __init__(self, models: dict[str, Model]) -> None:
        self.models = models

    def get(self, name: str, version: int | None = None) -> Model:
        """The model called ``name`` (NOT_FOUND phrased as TF Serving phrases it)."""
        model = self.models.get(name)
        if model is None:
            what = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise ServingError("NOT_FOUND", f"Servable not found for request: {what}")
        return model

    def start_polling(self, interval: float) -> threading.Event:
        """Poll every model's base path in a daemon thread; set the returned event to stop."""
        stop = threading.Event()
        for model in self.models.values():
            threading.Thread(target=model.poll, args=(stop, interval), daemon=True,
                             name=f"poll-{model.name}").start()
        return stop


def wait_available(model: Model, timeout: float) -> bool:
    """Load ``model``'s newest version now, or wait for one for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        model.refresh()
        if model.serving_version is not None:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
