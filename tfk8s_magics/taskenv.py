"""A task's environment, built rather than copied.

A task gets an explicit allow-list of the launching process's variables
(what a Python program needs to start and find its libraries), then the
lab's own defaults, then the user's ``--env``, then the variables the lab
reserves (``TF_CONFIG``, ``TFK8S_TASK``, …).  So a flag always wins over
whatever the launching process happened to inherit: ``--no-legacy-keras``
works under a hub that exports ``TF_USE_LEGACY_KERAS=1``.

**Quiet by default.**  TensorFlow's C++ INFO/WARNING lines and the CUDA
probing of a machine without GPUs (oneDNN notices, "Could not find cuda
drivers", ``failed call to cuInit``, the absl banner) come before the
user's own lines in every log.  :func:`quiet_env` hides them;
``TFK8S_QUIET=0`` (or ``--env TF_CPP_MIN_LOG_LEVEL=0``) brings them back.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Mapping

from .options import OPTIONS, parse_bool
from .scriptcheck import split_path

#: Variables a task inherits from the process that launches it.
INHERITED = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
        "TERM", "TMP", "TEMP", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX",
        "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
        "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR",
        "KERAS_HOME", "TFDS_DATA_DIR", "JUPYTERHUB_USER",
        "TFK8S_LOOPBACK_ONLY", "TFK8S_QUIET", "COVERAGE_PROCESS_START",
    }
)
#: Prefixes of inherited variables (locale settings).
INHERITED_PREFIXES = ("LC_",)

#: What quiet means, set before TensorFlow is imported.  Level 2 hides the
#: C++ INFO and WARNING lines (oneDNN's notice and "Could not find cuda
#: drivers" are INFO); the GLOG/absl thresholds do the same for XLA's and
#: absl's own loggers.
QUIET = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "GLOG_minloglevel": "2",
    "ABSL_MIN_LOG_LEVEL": "2",
}


def quiet_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether TensorFlow's own logging is hidden: option ``quiet`` (``TFK8S_QUIET``, default on),
    read from ``env`` (a launching process's environment) or this process's."""
    option = OPTIONS["quiet"]
    value = (os.environ if env is None else env).get(option.env or "")
    try:
        return option.default if value is None else parse_bool(value)
    except ValueError:
        return option.default


def quiet_env() -> dict[str, str]:
    """The variables that hide TensorFlow's C++ logging (see the module docstring)."""
    return dict(QUIET)


def inherited(source: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``source`` (the launching process's environment)."""
    return {
        k: v for k, v in source.items()
        if k in INHERITED or k.startswith(INHERITED_PREFIXES)
    }


def build(
    source: Mapping[str, str],
    user_env: Mapping[str, str],
    reserved: Mapping[str, str],
    legacy_keras: bool,
) -> dict[str, str]:
    """A task's environment: allow-list, lab defaults, the user's ``--env``, reserved variables.

    ``PYTHONPATH`` from ``--env`` extends the inherited one (in front)
    instead of replacing it, as the pre-launch import check assumes.
    """
    env = inherited(source)
    if quiet_enabled(source):
        env.update(quiet_env())
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(user_env)
    path = os.pathsep.join(
        dict.fromkeys(split_path(user_env.get("PYTHONPATH")) + split_path(source.get("PYTHONPATH")))
    )
    if path:
        env["PYTHONPATH"] = path
    env.update(reserved)
    return env


def quiet_this_process() -> None:
    """Hide TensorFlow's C++ logging in this process (a kernel about to import TensorFlow).

    Only variables the user has not set are touched, and only when quiet
    is on; it must run before TensorFlow's first import to have an effect.
    """
    if not quiet_enabled():
        return
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)


#: Lines TensorFlow prints while it is imported, before its log level applies:
#: absl's pre-initialisation INFO/WARNING lines, its banner, the CUDA probe's error.
_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] .*"
    r"|E\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] failed call to cuInit.*)$"
)


def is_noise(line: str) -> bool:
    """Whether ``line`` is TensorFlow start-up noise that quiet mode hides."""
    return bool(_NOISE.match(line.rstrip("\r\n")))


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Makes the first ``import tensorflow`` of this process go through :func:`import_tensorflow`'s filter."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - importlib protocol
        if fullname != "tensorflow" or not quiet_enabled():
            return None
        sys.meta_path.remove(self)  # once: find the real module, then wrap its loading
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):  # noqa: D102 - importlib protocol
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102 - importlib protocol
        with _filtered_stderr():
            self.loader.exec_module(module)
            _probe_devices(module)


def install_quiet_import() -> None:
    """Filter the start-up noise of this process's first ``import tensorflow``, whoever imports it.

    The extension installs it when loaded, so a notebook's own ``import
    tensorflow`` (before or without ``connect``) is as quiet as a task's.
    """
    quiet_this_process()
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlowFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlowFinder())


@contextlib.contextmanager
def _filtered_stderr():
    """Redirect file descriptor 2 into a file; write back every line that is not noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines() if not is_noise(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()


def import_tensorflow():
    """``import tensorflow``, with its start-up noise filtered out of stderr when quiet is on.

    Those lines are written by C++ to file descriptor 2 before any log
    level applies, so the descriptor itself is redirected for the import
    and every line that is not noise is written back.
    """
    if "tensorflow" in sys.modules or not quiet_enabled():
        import tensorflow

        return tensorflow
    quiet_this_process()
    with _filtered_stderr():
        import tensorflow

        _probe_devices(tensorflow)
    return tensorflow


def _probe_devices(tf) -> None:
    """List the physical devices now, inside the filter: that is when CUDA is probed (and
    ``failed call to cuInit`` is printed on a machine without GPUs)."""
    try:
        tf.config.list_physical_devices()
    except Exception:  # noqa: BLE001 - a probe only; TensorFlow reports real problems later
        pass
