"""``python -m tfk8s_magics.storage fetch URL DEST`` | ``upload SRC URL`` | ``fetch-models URL DEST
[--model M]``: one transfer, with progress.

Prints a progress line at most every :data:`PROGRESS_EVERY` seconds and a
last one with the totals; exits 0, or 1 with one sentence on stderr.
Credentials come from the environment or fsspec's config, never from
arguments (the Kubernetes init container and upload step run exactly this).
"""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import SpecError
from .transfer import fetch_models, sync_down, upload

#: Seconds between progress lines.
PROGRESS_EVERY = 1.0


def human(n: float) -> str:
    """Bytes as a short human figure (``12.5 MB``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"


class Printer:
    """``progress(done, total)`` printing a line at most every :data:`PROGRESS_EVERY` seconds."""

    def __init__(self, verb: str, out=sys.stdout) -> None:
        self.verb, self.out, self.next = verb, out, 0.0

    def __call__(self, done: int, total: int) -> None:
        """Print ``done`` of ``total`` bytes, unless a line went out less than a second ago."""
        now = time.monotonic()
        if now < self.next and done < total:
            return
        self.next = now + PROGRESS_EVERY
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        print(f"tfk8s-storage: {self.verb} {human(done)} of {human(total)}{pct}", file=self.out, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run one fetch or upload; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m tfk8s_magics.storage",
                                     description="fetch a URL into a dir, or upload a dir to a URL")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fetch = sub.add_parser("fetch", help="copy every object under URL into DEST")
    fetch.add_argument("url")
    fetch.add_argument("dest")
    up = sub.add_parser("upload", help="copy every file under SRC to URL")
    up.add_argument("src")
    up.add_argument("url")
    models = sub.add_parser("fetch-models", help="copy the exported models of a --backup URL (its "
                            "models/) or of a models dir into DEST")
    models.add_argument("url")
    models.add_argument("dest")
    models.add_argument("--model", help="fail unless DEST then holds a complete version of this model")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if args.cmd == "fetch":
            done = sync_down(args.url, args.dest, progress=Printer("fetched"))
        elif args.cmd == "fetch-models":
            done = fetch_models(args.url, args.dest, args.model, progress=Printer("fetched"))
        else:
            done = upload(args.src, args.url, progress=Printer("uploaded"))
    except SpecError as e:
        print(f"tfk8s-storage: {e}", file=sys.stderr, flush=True)
        return 1
    took = time.monotonic() - started
    print(f"tfk8s-storage: done: {done['files']} file(s), {human(done['bytes'])} in {took:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
