"""``python -m devcluster.keeper DIR``: keep the cluster's processes running and its volumes free.

Two jobs a real cluster's machinery does and this one-machine cluster must do itself:
restart a control-plane process that exits (see :meth:`Procs.keep`), and recycle the "standard"
class's hostPath volumes: a volume whose claim was deleted (``Released``) is emptied and made
``Available`` again, as the old ``Recycle`` reclaim policy did, so the pool serves any number of
test clusters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .cluster import fresh_volume_dir
from .procs import Procs

RECYCLE_PERIOD = 5.0


class Recycler:
    """Empties and frees the Released volumes of the pool, at most every RECYCLE_PERIOD seconds."""

    def __init__(self, root: Path):
        from .build import COMPONENTS

        self.root = root
        self.kubectl = [
            str(COMPONENTS["kubernetes"].path("kubectl")),
            "--kubeconfig",
            str(root / "admin.kubeconfig"),
        ]
        self.at = 0.0

    def __call__(self) -> None:
        """One round: free every Released volume of the pool (the API server away: next round)."""
        if time.monotonic() - self.at < RECYCLE_PERIOD:
            return
        self.at = time.monotonic()
        r = subprocess.run(
            [*self.kubectl, "get", "pv", "-o", "json"], capture_output=True, text=True, timeout=30
        )
        if r.returncode:
            return  # the API server is away: next round
        for pv in json.loads(r.stdout).get("items", []):
            spec = pv.get("spec", {})
            if pv.get("status", {}).get("phase") != "Released" or spec.get("storageClassName") != "standard":
                continue
            path = Path((spec.get("hostPath") or {}).get("path", ""))
            if not path.is_relative_to(self.root / "volumes"):
                continue  # only our own pool's directories are ever emptied
            shutil.rmtree(path, ignore_errors=True)
            fresh_volume_dir(path)  # the PV says type Directory: it must exist, writable by non-root
            subprocess.run(
                [
                    *self.kubectl,
                    "patch",
                    "pv",
                    pv["metadata"]["name"],
                    "--type",
                    "json",
                    "-p",
                    '[{"op": "remove", "path": "/spec/claimRef"}]',
                ],
                capture_output=True,
                timeout=30,
            )


if __name__ == "__main__":
    root = Path(sys.argv[1])
    Procs(root).keep(skip=("keeper",), also=Recycler(root))
