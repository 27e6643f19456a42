"""Which tasks a pooled process can run: the compatibility rules of the warm pool.

A task runs cold when its import-time environment differs from the pool's
(:func:`mismatch`): TensorFlow and Keras read variables such as
``TF_CPP_MIN_LOG_LEVEL``, ``TF_USE_LEGACY_KERAS`` or ``OMP_NUM_THREADS``
once, at import, so a pooled process could not honour a different value.
The loopback shim is the one exception to "same value or cold": tasks behind
it (in-graph clusters) need it preloaded at exec, tasks in a private network
namespace have none, so a pooled process preloads it and a namespaced task
switches it off (every ``bind()`` passes through; :func:`shim_off`): one pool
serves both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .... import options, taskenv
from ....isolation import shim as loopback_shim
from ....isolation.plan import Platform, plan_pool

#: Variables every task gets its own value of, read after start-up (never at import).
LATE = frozenset({
    "TF_CONFIG", "TFK8S_TASK", "TFK8S_CLUSTER", "TFK8S_LOG_DIR", "TFK8S_DATA_DIR",
    "TFK8S_CHECKPOINT_DIR", "TFK8S_PROGRESS_FILE", "TFK8S_SCRIPT", "TFK8S_SCRIPT_DIR",
    "TFK8S_FILES_DIR", "TFK8S_READY_FD", "TFK8S_CLUSTER_ID", "TFK8S_TERMINATION_FILE",
    "TFK8S_SCRIPT_IS_CELL",
})

#: Variables a task may add (``--env``) that something could read at interpreter start or at
#: ``import tensorflow``: such a task runs cold unless the pool has the same value.
IMPORT_TIME = re.compile(
    r"^(TF_|TENSORFLOW|KERAS|CUDA|NVIDIA|OMP_|MKL|KMP_|XLA|GLOG|ABSL|PYTHON|LD_|GRPC|TPU|"
    r"OPENBLAS|NCCL|HIP_|ROCM|MALLOC|TCMALLOC|JAX|TFK8S_|LC_|LANG|TZ$|HOME$|TMP|TEMP)"
)


def pool_shim() -> str | None:
    """The loopback shim a pooled process preloads (None: isolation is off or no shim here).

    Tasks behind the shim (in-graph clusters, ``TFK8S_ISOLATION=loopback``, a refused
    namespace) need it preloaded at exec, which a pooled process cannot do after the fact;
    tasks in a private network namespace have none, and a pooled process switches it off for
    them (:func:`shim_off`), so one pool serves both.
    """
    found = loopback_shim.shim_path()
    return plan_pool(Platform(shim=str(found) if found else None), None).shim


def base_env(source: Mapping[str, str] | None = None, shim: str | None = None) -> dict[str, str]:
    """The environment of a pooled process: what a task of a default launch gets, minus its
    identity, with ``shim`` (:func:`pool_shim`) preloaded."""
    source = os.environ if source is None else source
    env = taskenv.build(source, {}, {}, options.OPTIONS["legacy_keras"].default)
    loopback_shim.preload_env(env, shim)
    return env


def _without_shim(preload: str | None, shim: str) -> str | None:
    """``LD_PRELOAD`` ``preload`` without ``shim`` (None when nothing is left)."""
    rest = [p for p in (preload or "").split(" ") if p and p != shim]
    return " ".join(rest) or None


def shim_off(pool: Mapping[str, str], task: Mapping[str, str], shim: str | None) -> bool:
    """Whether a task must run with the pool's preloaded ``shim`` switched off (its own
    ``LD_PRELOAD`` does not have it: a task in a private network namespace)."""
    return bool(shim) and shim in (pool.get("LD_PRELOAD") or "").split(" ") and (
        shim not in (task.get("LD_PRELOAD") or "").split(" "))


def mismatch(pool: Mapping[str, str], task: Mapping[str, str], shim: str | None = None) -> str:
    """Why a task with environment ``task`` cannot run in a process started with ``pool`` ("" if it can).

    ``shim``: the loopback shim the pool preloads; a task whose ``LD_PRELOAD`` is
    the pool's without it runs with the shim switched off (:func:`shim_off`).
    """
    for key, value in pool.items():
        if key in LATE:
            continue
        if key == "LD_PRELOAD" and shim_off(pool, task, shim) and (
                _without_shim(value, shim) == task.get("LD_PRELOAD")):
            continue
        if key not in task:
            return f"{key} is unset for the task but {value!r} in the pool"
        if task[key] != value:
            return f"{key} is {task[key]!r} for the task but {value!r} in the pool"
    for key in task:
        if key not in pool and key not in LATE and IMPORT_TIME.match(key):
            return f"{key} is set for the task and may be read at start-up; the pool has none"
    return ""
