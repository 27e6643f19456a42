"""Run TensorBoard for as long as its owner lives.

``python -m tfk8s_magics.runtime.tensorboard OWNER_PID ARGS...``

The owner is the process (the notebook kernel) that asked for it; when the
owner exits, so does this TensorBoard.
"""

from __future__ import annotations

import sys

from ..lifeline import exit_with


def main() -> None:
    """Start TensorBoard with ``ARGS`` tied to ``OWNER_PID``."""
    owner = int(sys.argv[1])
    exit_with(owner)
    from tensorboard.main import run_main

    sys.argv = ["tensorboard", *sys.argv[2:]]
    run_main()


if __name__ == "__main__":
    main()
