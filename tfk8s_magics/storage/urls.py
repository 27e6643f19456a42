"""Object-storage URLs: which schemes, which package each needs, what a URL may not carry (pure).

A URL is checked where it is given (the spec and the options): its scheme
must be one fsspec knows and this module lists, ``http(s)://`` is read
only, and a URL never carries credentials (``s3://KEY:SECRET@bucket``, a
presigned query): those come from the environment or fsspec's config only,
so nothing the lab records (spec, record, events, rendered YAML) holds one.
Messages show a URL only once it is known to carry none.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from ..errors import StorageError

#: scheme → (the fsspec implementation's package, the pip name that brings it).  ``None``: fsspec itself.
SCHEMES: dict[str, tuple[str, str] | None] = {
    "s3": ("s3fs", "s3fs"),
    "s3a": ("s3fs", "s3fs"),
    "gs": ("gcsfs", "gcsfs"),
    "gcs": ("gcsfs", "gcsfs"),
    "abfs": ("adlfs", "adlfs"),
    "abfss": ("adlfs", "adlfs"),
    "az": ("adlfs", "adlfs"),
    "hdfs": ("pyarrow", "pyarrow"),
    "http": ("aiohttp", "aiohttp"),
    "https": ("aiohttp", "aiohttp"),
    "memory": None,
}
#: The tfk8s-magics extra that brings each package (pyproject.toml's optional dependencies).
EXTRAS: dict[str, str] = {"s3fs": "storage", "aiohttp": "storage", "gcsfs": "gcs", "adlfs": "azure",
                          "pyarrow": "hdfs"}
#: Schemes that can only be read (a plain web server takes no uploads).
READ_ONLY = frozenset({"http", "https"})
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: Query keys that carry a credential (presigned S3/GCS URLs, SAS tokens, API keys).
_SECRET_KEY = re.compile(r"(signature|sig|token|secret|password|passwd|credential|key|sas|auth)",
                         re.IGNORECASE)


def is_url(text: object) -> bool:
    """Whether ``text`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(text, str) and bool(_URL.match(text))


def scheme(url: str) -> str:
    """The URL's scheme, lowercase (``s3``)."""
    found = _URL.match(url)
    return found.group(1).lower() if found else ""


def _redacted(url: str) -> str:
    """``url`` without user info or query: safe to show in a message."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def check_url(flag: str, url: str, *, writable: bool = False) -> str:
    """``url`` if it can be used for ``flag``; else one :class:`StorageError` sentence.

    ``writable``: the lab will upload there (``--backup``), so a read-only
    scheme is refused.
    """
    if not isinstance(url, str) or not is_url(url):
        raise StorageError(f"{flag} {url!r} is not a URL: give scheme://bucket/path, e.g. s3://my-bucket/run1.")
    kind = scheme(url)
    if kind not in SCHEMES:
        raise StorageError(
            f"{flag} {_redacted(url)!r}: the scheme {kind}:// is not supported; use one of "
            f"{', '.join(s + '://' for s in SCHEMES)}."
        )
    parts = urlsplit(url)
    secret_query = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_KEY.search(k)]
    if "@" in parts.netloc or secret_query:
        where = "user info before '@'" if "@" in parts.netloc else f"the query parameter {secret_query[0]!r}"
        what = "a password" if ":" in parts.netloc.rpartition("@")[0] else "credentials"
        raise StorageError(
            f"{flag} {_redacted(url)!r} carries {what} ({where}): remove them from the URL; "
            "credentials come from your environment (e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) or "
            "fsspec's config, and on Kubernetes from --credentials-secret."
        )
    if writable and kind in READ_ONLY:
        raise StorageError(
            f"{flag} {_redacted(url)!r}: {kind}:// is read-only; give a URL the lab can upload to "
            "(s3://, gs://, abfs://, hdfs://)."
        )
    if not (parts.netloc or parts.path.strip("/")):
        raise StorageError(f"{flag} {url!r} names no bucket or path: give e.g. {kind}://my-bucket/run1.")
    return url


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, one ``/`` between each."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])
