"""Jupyter server settings of the lab's notebook image.

The lab's JupyterLab defaults, as on one machine (``hub_config/jupyter``): the server never
fetches JupyterLab's news or checks for updates; ``overrides.json`` (installed beside JupyterLab)
turns their pop-up off and starts new notebooks on the lab's kernel. A user whose home has no
``examples/`` yet gets the lab's example notebooks there (never overwriting a folder of theirs).

TensorBoard is reached through jupyter-server-proxy under the user's server
URL (so behind the hub's authentication, never a NodePort): a local one at
``proxy/<port>/`` and a cluster's TensorBoard Service in the user's own
namespace at ``proxy/<service>.<namespace>.svc:<port>/``.  Only those hosts
may be proxied.
"""

import json
import os
import re
from pathlib import Path

c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file

_namespace = re.escape(os.environ.get("TFK8S_NAMESPACE", ""))
_own_services = re.compile(rf"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.{_namespace}\.svc(\.cluster\.local)?$")


def host_allowlist(handler, host):
    """Loopback, and Services of this user's namespace only."""
    return host in ("localhost", "127.0.0.1") or bool(_namespace and _own_services.match(host))


c.ServerProxy.host_allowlist = host_allowlist


c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"

#: The example notebooks the image ships (``notebooks/`` of the repository).
EXAMPLES = Path("/opt/tfk8s/notebooks")


def lab_kernel_metadata() -> dict:
    """What the lab's kernel writes into a notebook it runs: its kernelspec and language info (a
    copy that carried other values would open "modified", asking to be saved)."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": "python3"},
            "language_info": dict(IPythonKernel.language_info)}


def give_examples(home: Path, examples: Path = EXAMPLES) -> bool:
    """Copy the example notebooks into ``home/examples`` unless that exists; whether it did."""
    target = home / "examples"
    notebooks = sorted(examples.glob("*.ipynb")) if examples.is_dir() else []
    if not notebooks or target.exists() or target.is_symlink():
        return False
    try:
        metadata = lab_kernel_metadata()
        target.mkdir()
        for nb in notebooks:
            doc = json.loads(nb.read_text(encoding="utf-8"))
            doc.setdefault("metadata", {}).update(metadata)
            (target / nb.name).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n",
                                          encoding="utf-8")
    except (OSError, ValueError):  # a read-only or full home: the server starts anyway
        return False
    return True


give_examples(Path(os.path.expanduser("~")))
