"""Fetch and upload through fsspec: scripts and files, a data dir, checkpoints and models.

Every failure is one :class:`~tfk8s_magics.errors.StorageError` sentence
(the URL, what went wrong, what to do), and a failed transfer leaves
nothing behind: a download goes to a hidden temporary dir beside its
destination and is renamed into place only when complete; an upload that
fails removes the objects it wrote.  Credentials are never arguments: each
filesystem takes them from the environment or fsspec's config
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_ENDPOINT_URL`` for
``s3://``), so nothing here can print or record one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StorageError
from .urls import EXTRAS, SCHEMES, check_url, join, scheme

#: ``progress(done_bytes, total_bytes)``, called from the transferring thread.
Progress = Callable[[int, int], None]


def _need_fsspec():
    try:
        return importlib.import_module("fsspec")
    except ImportError:
        raise StorageError(
            "object-storage URLs need the fsspec package, which is not installed: "
            "pip install 'tfk8s-magics[storage]' (fsspec + s3fs), or use a local path."
        ) from None


def missing_package(kind: str, package: str) -> StorageError:
    """The sentence for a URL whose filesystem package is not installed: the extra that brings it."""
    extra = EXTRAS.get(package, "storage")
    return StorageError(f"{kind}:// URLs need the {package} package, which is not installed: "
                        f"pip install 'tfk8s-magics[{extra}]' (or pip install {package}).")


def open_fs(url: str):
    """``(filesystem, path)`` for ``url``; a missing package is one sentence naming what to install."""
    fsspec = _need_fsspec()
    kind = scheme(url)
    need = SCHEMES.get(kind)
    if need and importlib.util.find_spec(need[0]) is None:  # before fsspec's own, vaguer error
        raise missing_package(kind, need[1])
    try:
        # Not fsspec's cached instance: credentials fixed in the environment take effect at once.
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    except ImportError:
        raise missing_package(kind, need[1] if need else "fsspec") from None
    except ValueError as e:
        raise StorageError(f"{url!r} cannot be opened: {e}.") from None
    return fs, path


def _causes(e: BaseException) -> list[BaseException]:
    """``e`` and what it was raised from or during, first to last (no loops)."""
    chain: list[BaseException] = []
    while e is not None and e not in chain and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def _unreachable(e: BaseException, url: str, what: str) -> StorageError | None:
    """The sentence for a server that could not be reached or not be trusted, or None.

    fsspec's HTTP filesystem reports every failed lookup as ``FileNotFoundError`` raised from
    the real cause: an untrusted certificate or a refused connection is not a missing object.
    """
    for cause in _causes(e):
        if isinstance(cause, ssl.SSLCertVerificationError):  # aiohttp's own subclasses it
            verified = next((c for c in _causes(cause) if getattr(c, "verify_message", None)), cause)
            why = (getattr(verified, "verify_message", None) or str(verified)).strip().rstrip(".")
            return StorageError(
                f"{what} {url!r}: the server's TLS certificate was not accepted ({why}); if it is signed "
                "by your own CA, set SSL_CERT_FILE to that CA's certificate (PEM) where the lab runs."
            )
        if isinstance(cause, ssl.SSLError):
            why = getattr(cause, "reason", None) or cause
            return StorageError(f"{what} {url!r}: the TLS handshake failed ({why}); "
                                "check that the URL's scheme and port are the server's.")
        if isinstance(cause, ConnectionError | TimeoutError) or type(cause).__name__ in (
            "ClientConnectorError", "ClientOSError", "ServerDisconnectedError", "EndpointConnectionError"
        ):
            why = (getattr(cause, "strerror", None) or str(cause) or type(cause).__name__).strip().rstrip(".")
            return StorageError(f"{what} {url!r}: the server cannot be reached ({why}); check the host and "
                                "port, and that the server is running.")
    return None


def explain(e: BaseException, url: str, what: str) -> StorageError:
    """One sentence for a failed storage call: missing object, refused credentials, an unreachable
    or untrusted server, or the cause."""
    name = type(e).__name__
    text = str(e).strip().rstrip(".")
    unreachable = _unreachable(e, url, what)
    if unreachable is not None:
        return unreachable
    if isinstance(e, FileNotFoundError):
        return StorageError(f"{what} {url!r} does not exist: check the bucket and path.")
    if isinstance(e, PermissionError) or name in ("NoCredentialsError", "PartialCredentialsError"):
        return StorageError(
            f"{what} {url!r}: access was refused ({text or name}); check the credentials in your "
            "environment (e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) or fsspec's config."
        )
    return StorageError(f"{what} {url!r} failed: {name}: {text or 'no detail'}.")


@dataclass(frozen=True)
class Fetched:
    """A fetched text object: its text, size in bytes and sha256 (hex)."""

    url: str
    text: str
    size: int
    sha256: str

    def source(self) -> dict[str, Any]:
        """What a cluster records of it: ``{"url", "size", "sha256"}``."""
        return {"url": self.url, "size": self.size, "sha256": self.sha256}


def fetch_text(url: str, limit: int, flag: str = "--script") -> Fetched:
    """Fetch one regular object of at most ``limit`` bytes as UTF-8 text (a script or a ``--file``)."""
    check_url(flag, url)
    fs, path = open_fs(url)
    try:
        info = fs.info(path)
        if info.get("type") != "file":
            raise StorageError(f"{flag} {url!r} is a directory, not an object: give the URL of one file.")
        size = info.get("size")
        if size is not None and size > limit:
            raise StorageError(f"{flag} {url!r} is {size} bytes, more than {limit}: give a file under that "
                               "size (put data in --data-dir instead).")
        with fs.open(path, "rb") as f:
            data = f.read(limit + 1)
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - every filesystem raises its own; one sentence each
        raise explain(e, url, flag) from None
    if len(data) > limit:
        raise StorageError(f"{flag} {url!r} is larger than {limit} bytes: give a file under that size.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StorageError(f"{flag} {url!r} is not UTF-8 text: {e}.") from None
    return Fetched(url, text, len(data), hashlib.sha256(data).hexdigest())


class _Bytes:
    """fsspec callbacks that add up the bytes of every file of one transfer into ``progress``."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.progress is not None:
            self.progress(done, self.total)

    def callback(self):
        """A top-level fsspec Callback whose per-file children report bytes here."""
        from fsspec.callbacks import Callback  # deferred: fsspec is an optional extra

        owner = self

        class Child(Callback):
            reported = 0

            def call(self, *args, **kwargs):
                value = self.value if isinstance(self.value, int) else 0
                if value > self.reported:
                    owner.add(value - self.reported)
                    self.reported = value

        class Top(Callback):
            def branched(self, path_1, path_2, **kwargs):
                return Child()

        return Top()


def _listing(fs, path: str) -> tuple[dict[str, int], bool]:
    """(relative name → size of every object under ``path``, whether ``path`` is one object itself),
    from one listing (``find`` gives an object's own entry when ``path`` names one)."""
    base = path.rstrip("/") + "/"
    out, single = {}, False
    for name, info in fs.find(path, detail=True).items():
        if info.get("type") != "file":
            continue
        size = info.get("size")
        if size is None:  # an HTTP index page lists names only: ask each object (a HEAD)
            size = fs.info(name).get("size")
        if name.rstrip("/") == path.rstrip("/"):
            single = True
            out = {path.rstrip("/").rpartition("/")[2]: int(size or 0)}
            break
        if name.startswith(base) and len(name) > len(base):
            out[name[len(base):]] = int(size or 0)
    if not out:
        fs.info(path)  # nothing listed: raises if missing, from the cause (an unreachable server too)
    return out, single


def _safe_rel(rel: str) -> str:
    """A relative name that stays inside its destination (no ``..``, no absolute path)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise StorageError(f"the object name {rel!r} would land outside the destination; rename it.")
    return "/".join(parts)


def sync_down(url: str, dest_dir: str | os.PathLike, progress: Progress | None = None,
              what: str = "--data-dir") -> dict[str, int]:
    """Copy every object under ``url`` into ``dest_dir`` (created); return ``{"files", "bytes"}``.

    Objects arrive in a hidden temporary dir inside ``dest_dir`` and are moved
    into place only once all arrived, so a failure leaves ``dest_dir`` as it was.
    ``progress(done, total)`` is called as bytes arrive; ``what`` names the flag in messages.
    """
    check_url(what, url)
    fs, path = open_fs(url)
    dest = Path(dest_dir)
    try:
        listed, single = _listing(fs, path)
        names = {_safe_rel(rel): size for rel, size in listed.items()}
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - one sentence whatever the filesystem raised
        raise explain(e, url, what) from None
    total = sum(names.values())
    made = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=".tfk8s-sync-", dir=dest))
    counter = _Bytes(total, progress)
    try:
        rpaths = [path if single else join(path, rel) for rel in names]
        lpaths = [str(tmp / rel) for rel in names]
        for lp in lpaths:
            Path(lp).parent.mkdir(parents=True, exist_ok=True)
        if rpaths:
            fs.get(rpaths, lpaths, callback=counter.callback())
        for rel in names:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if made:
            shutil.rmtree(dest, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, StorageError):
            raise explain(e, url, what) from None
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    if progress is not None:
        progress(total, total)
    return {"files": len(names), "bytes": total}


def _complete_models(root: Path) -> list[str]:
    """The models under ``root`` with a complete version (``<model>/<whole number>/saved_model.pb``)."""
    return sorted(
        m.name for m in root.iterdir() if m.is_dir()
        and any(v.name.isdigit() and (v / "saved_model.pb").is_file() for v in m.iterdir())
    ) if root.is_dir() else []


def fetch_models(url: str, dest_dir: str | os.PathLike, model: str | None = None,
                 progress: Progress | None = None) -> dict[str, int]:
    """Copy the exported models under ``url`` into ``dest_dir``: ``url`` is a ``--backup`` URL (its
    ``models/`` is taken) or a models dir itself (``<model>/<version>/``).  With ``model``, the copy
    must hold a complete version of it, else nothing is kept and one sentence says what was found.
    Return ``{"files", "bytes"}``; ``serve --from`` (local, and the serving pod's init container)."""
    check_url("--from", url)
    dest = Path(dest_dir)
    made = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=".tfk8s-models-", dir=dest))
    try:
        try:
            done = sync_down(join(url, "models"), tmp, progress, what="--from")
        except StorageError as first:
            if "does not exist" not in str(first):
                raise
            done = sync_down(url, tmp, progress, what="--from")  # the URL of a models dir itself
        found = _complete_models(tmp)
        if model is not None and model not in found:
            raise StorageError(
                f"--from {url!r} holds no complete export of model {model!r} (found: "
                f"{', '.join(found) or 'none'}): give one of those with --model, or the URL of a "
                "--backup or of a models dir (<model>/<version>/saved_model.pb)."
            )
        for entry in tmp.iterdir():
            target = dest / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
    except BaseException:
        shutil.rmtree(dest if made else tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return done


def upload(src_dir: str | os.PathLike, url: str, progress: Progress | None = None,
           what: str = "--backup") -> dict[str, int]:
    """Copy every file under ``src_dir`` to ``url`` (same relative names); return ``{"files", "bytes"}``.

    If the upload fails part-way, the objects it wrote are removed again (best effort).
    """
    check_url(what, url, writable=True)
    src = Path(src_dir)
    files = sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink()) if src.is_dir() else []
    if not files:
        return {"files": 0, "bytes": 0}
    fs, path = open_fs(url)
    rels = [p.relative_to(src).as_posix() for p in files]
    rpaths = [join(path, rel) for rel in rels]
    total = sum(p.stat().st_size for p in files)
    counter = _Bytes(total, progress)
    try:
        fs.put([str(p) for p in files], rpaths, callback=counter.callback())
    except BaseException as e:
        for rp in rpaths:
            try:
                fs.rm_file(rp)
            except Exception:  # noqa: BLE001,S110 - best effort: it may never have been written
                pass
        if isinstance(e, Exception):
            raise explain(e, url, what) from None
        raise
    if progress is not None:
        progress(total, total)
    return {"files": len(files), "bytes": total}


def probe(url: str, flag: str, *, write: bool = False) -> None:
    """Check before a launch that ``url`` can be used: it exists and the credentials are accepted
    (read), or an object can be written there (``write``: a small probe object, removed at once)."""
    check_url(flag, url, writable=write)
    fs, path = open_fs(url)
    try:
        if not write:
            fs.info(path)
            return
        name = join(path, f".tfk8s-probe-{os.getpid()}-{threading.get_ident()}")
        fs.pipe_file(name, b"")
        fs.rm_file(name)
    except Exception as e:  # noqa: BLE001 - one sentence whatever the filesystem raised
        raise explain(e, url, flag) from None
