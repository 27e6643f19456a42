"""``python -m devcluster.keeper DIR``: keep the cluster's processes running (see Procs.keep)."""

from __future__ import annotations

import sys
from pathlib import Path

from .procs import Procs

if __name__ == "__main__":
    Procs(Path(sys.argv[1])).keep(skip=("keeper",))
