"""tfk8s_magics: launch distributed TensorFlow clusters from Jupyter, locally or on Kubernetes.

``%load_ext tfk8s_magics`` adds ``%tfcluster`` / ``%%tfcluster``.  The same
things are one call each of the Python API, usable without IPython::

    import tfk8s_magics as tk
    cluster = tk.launch("mnist", workers=2, script=source)
    cluster.wait()
    strategy = tk.connect("ig")          # in-graph: this process is the client

Training scripts report progress with :func:`report_progress` or
:func:`progress_callback`, or subclass :class:`Trainer` and let the
platform do it; :func:`serve` serves what a cluster exported.  Heavy modules (TensorFlow, IPython, the
Kubernetes client) are imported only when used, and so is each public name: importing the
package loads no other module of it until one of its names is used.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers; at run time they load on first use
    from .api import (
        Cluster,
        connect,
        get,
        launch,
        list_clusters,
        make_spec,
        render,
        render_objects,
        resolver,
        serve,
        train,
    )
    from .errors import (
        ClusterExists,
        ClusterNotFound,
        ClusterTimeout,
        LaunchFailed,
        SpecError,
        TaskNotFound,
        TFClusterError,
    )
    from .runtime.progress import progress_callback, report_progress
    from .spec import ClusterSpec, Resources, Task
    from .trainer import Trainer, TrainerOptions

#: Each public name → the module that defines it, imported at the name's first use (PEP 562):
#: ``import tfk8s_magics`` loads nothing else, so a security component that imports one
#: submodule (the kernel launcher, the owner-only relay) loads only what that submodule needs.
_LAZY = {
    **dict.fromkeys(("Cluster", "connect", "get", "launch", "list_clusters", "make_spec", "render",
                     "render_objects", "resolver", "serve", "train"), ".api"),
    **dict.fromkeys(("ClusterExists", "ClusterNotFound", "ClusterTimeout", "LaunchFailed", "SpecError",
                     "TaskNotFound", "TFClusterError"), ".errors"),
    **dict.fromkeys(("progress_callback", "report_progress"), ".runtime.progress"),
    **dict.fromkeys(("ClusterSpec", "Resources", "Task"), ".spec"),
    **dict.fromkeys(("Trainer", "TrainerOptions"), ".trainer"),
}


def __getattr__(name: str) -> Any:
    """Load a public name (or a submodule, ``tk.api``) at its first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "ClusterExists",
    "ClusterNotFound",
    "ClusterSpec",
    "ClusterTimeout",
    "LaunchFailed",
    "Resources",
    "SpecError",
    "TFClusterError",
    "Task",
    "TaskNotFound",
    "Trainer",
    "TrainerOptions",
    "connect",
    "get",
    "launch",
    "list_clusters",
    "load_ipython_extension",
    "make_spec",
    "progress_callback",
    "render",
    "render_objects",
    "report_progress",
    "resolver",
    "serve",
    "task_info",
    "train",
]

def task_info() -> dict:
    """Inside a task: its TF_CONFIG as a dict plus ``is_chief`` (the chief, or worker 0 without one)."""
    import json
    import os

    cfg = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = cfg.get("task", {})
    cluster = cfg.get("cluster", {})
    chief = "chief" in cluster
    cfg["is_chief"] = task.get("type") == "chief" or (
        not chief and task.get("type") == "worker" and int(task.get("index", 0)) == 0
    )
    return cfg


def load_ipython_extension(ipython) -> None:
    """Register the magics (``%load_ext tfk8s_magics``) and the HTML view of a Cluster handle.

    Idempotent: the lab's IPython profile loads the extension at kernel start by calling this
    (not through ``%load_ext``), so a notebook's own ``%load_ext tfk8s_magics`` — which it keeps
    to run anywhere — loads nothing twice and prints nothing.
    """
    if getattr(ipython, "_tfk8s_magics_loaded", False):
        return
    # Deferred: the magics import IPython's magic machinery, which a task or script never needs.
    from .api import Cluster
    from .magics import TFClusterMagics, cluster_html
    from .taskenv import install_quiet_import

    # Before the notebook's first `import tensorflow`: no C++ INFO/WARNING or CUDA-probe noise.
    install_quiet_import()
    ipython.register_magics(TFClusterMagics(shell=ipython))
    ipython.display_formatter.formatters["text/html"].for_type(Cluster, cluster_html)
    ipython._tfk8s_magics_loaded = True


def unload_ipython_extension(ipython) -> None:
    """Nothing to undo: clusters keep running under their owner's rules."""
