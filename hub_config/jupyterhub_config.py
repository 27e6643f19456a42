"""JupyterHub for Kubernetes: one namespace per user, the extension's Kubernetes backend.

The Helm chart mounts this file at /etc/jupyterhub/jupyterhub_config.py and
its values at $TFK8S_HUB_VALUES (JSON: ``{"lab": ..., "hub": ...}``).  The
``tfk8s_hub`` package is installed in the hub image (images/hub); run from a
source tree, it is found next to this file.

Admin settings are ``c.LabSettings.*`` traits (hub_config/tfk8s_hub/settings.py);
the chart's ``lab:`` values set the same traits.  Anything else can be added
in the chart's ``hub.extraConfig``, which runs at the end of this file.
"""

import os
import sys
from pathlib import Path

try:
    import tfk8s_hub  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from tfk8s_hub.hub import configure_hub  # noqa: E402
from tfk8s_hub.settings import LabSettings, load_values_file  # noqa: E402
from tfk8s_hub.spawner import configure_kubernetes  # noqa: E402

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

values = load_values_file(c)
configure_hub(c, values.get("hub", {}))
configure_kubernetes(c, LabSettings(config=c))

extra = values.get("hub", {}).get("extraConfig")
if extra:
    # The administrator's own Python, from the chart values (as zero-to-jupyterhub's
    # hub.extraConfig): trusted like this file.
    exec(compile(extra, "hub.extraConfig", "exec"), {"c": c, "os": os})  # noqa: S102
