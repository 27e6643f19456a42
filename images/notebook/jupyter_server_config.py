"""Jupyter server settings of the lab's notebook image.

TensorBoard is reached through jupyter-server-proxy under the user's server
URL (so behind the hub's authentication, never a NodePort): a local one at
``proxy/<port>/`` and a cluster's TensorBoard Service in the user's own
namespace at ``proxy/<service>.<namespace>.svc:<port>/``.  Only those hosts
may be proxied.
"""

import os
import re

c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file

_namespace = re.escape(os.environ.get("TFK8S_NAMESPACE", ""))
_own_services = re.compile(rf"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.{_namespace}\.svc(\.cluster\.local)?$")


def host_allowlist(handler, host):
    """Loopback, and Services of this user's namespace only."""
    return host in ("localhost", "127.0.0.1") or bool(_namespace and _own_services.match(host))


c.ServerProxy.host_allowlist = host_allowlist
