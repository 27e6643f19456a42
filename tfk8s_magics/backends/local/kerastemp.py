"""Remove the temporary folders Keras leaves in a log dir when a multi-worker fit is cut short.

Under ``MultiWorkerMirroredStrategy`` only the chief writes checkpoints and TensorBoard
summaries where the script says; every other worker writes to a scratch folder beside it,
``<parent>/workertemp_<task id>/<name>`` (Keras's ``distributed_file_utils``), and Keras
removes that folder when ``fit`` returns.  A stopped (or failed) fit never returns, so the
folder stays — and TensorBoard on the log dir shows it as a run of its own
(``workertemp_1/train``) with half a worker's numbers.  Once a cluster has ended, nothing
writes there any more: the supervisor removes what Keras would have removed.

Only folders named exactly ``workertemp_<digits>`` are touched, no deeper than
:data:`MAX_DEPTH` below the log dir, and never through a symlink.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

#: How deep below the log dir a Keras scratch folder is looked for.
MAX_DEPTH = 3

_TEMP = re.compile(r"workertemp_\d+")


def keras_temp_dirs(log_dir: str | os.PathLike, max_depth: int = MAX_DEPTH) -> list[Path]:
    """The Keras scratch folders (``workertemp_N``) under ``log_dir``, at most ``max_depth`` deep."""
    found: list[Path] = []
    level = [Path(log_dir)]
    for _ in range(max_depth):
        below: list[Path] = []
        for folder in level:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if _TEMP.fullmatch(entry.name):
                    found.append(Path(entry.path))
                else:
                    below.append(Path(entry.path))
        level = below
    return found


def remove_keras_temp_dirs(log_dir: str | os.PathLike) -> list[Path]:
    """Remove the Keras scratch folders under ``log_dir``; return the ones removed."""
    removed = []
    for path in keras_temp_dirs(log_dir):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed
