"""What ``helm uninstall`` removes from the users' namespaces: the chart's pre-delete hook.

The release's own objects (hub, proxy, ClusterRoles, policies) go with the release. What the hub
made in the user namespaces does not, by itself: the users' notebook servers would run on
without a hub, their TensorFlow clusters with them, and each namespace would keep a RoleBinding
to the backend's ClusterRole that the uninstall deletes (a binding to nothing, which a later
ClusterRole of the same name would bring back to life). So, before the release goes, in every
namespace labelled ``tfk8s.io/hub-namespace=<the release's namespace>``:

===================================================  ==================  ==================
object                                               removed             kept
===================================================  ==================  ==================
notebook servers (KubeSpawner's pods)                always              —
TensorFlow clusters (JobSets), TensorBoards and      always              —
served models (the lab's Deployments)
the RoleBinding to the backend's ClusterRole         always              —
the namespace, with the home claims, the clusters'   ``removeNamespaces`` by default
records and log volumes, the ServiceAccount, quota,  (the whole
LimitRange and NetworkPolicy                         namespace)
===================================================  ==================  ==================

Kept by default because a home claim is a user's work: a reinstall (same release namespace)
finds the namespaces and reuses them. ``uninstall.removeNamespaces: true`` deletes them instead.

Run as ``python -m tfk8s_hub.uninstall --hub-namespace NS --role NAME [--remove-namespaces]``
with the hook's own ServiceAccount (it exists only while the hook runs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from .bootstrap import USER_NAMESPACE_LABEL

#: The label of every object the extension creates (the backend's ``managed-by``).
LAB_OBJECTS = "app.kubernetes.io/managed-by=tfk8s"
#: KubeSpawner's label of a notebook server's pod (and Service).
SERVER_PODS = "component=singleuser-server"


def user_namespaces(core: Any, hub_namespace: str) -> list[str]:
    """The user namespaces of the hub in ``hub_namespace`` (by the bootstrap's label)."""
    found = core.list_namespace(label_selector=f"{USER_NAMESPACE_LABEL}={hub_namespace}")
    return sorted(n.metadata.name for n in found.items if not n.metadata.deletion_timestamp)


def clean_namespace(api: Callable[[str], Any], namespace: str, role: str) -> list[str]:
    """Stop what runs in a kept user namespace and remove the binding to ``role``; return what
    was removed, one ``kind/name`` each."""
    core, rbac = api("CoreV1Api"), api("RbacAuthorizationV1Api")
    gone = []
    custom = api("CustomObjectsApi")
    jobsets = custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets",
                                                   label_selector=LAB_OBJECTS)["items"]
    if jobsets:  # their Jobs and pods go with them (the garbage collector)
        custom.delete_collection_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", label_selector=LAB_OBJECTS,
            propagation_policy="Background")
        gone += [f"jobset/{j['metadata']['name']}" for j in jobsets]
    apps = api("AppsV1Api")
    deployments = apps.list_namespaced_deployment(namespace, label_selector=LAB_OBJECTS).items
    if deployments:
        apps.delete_collection_namespaced_deployment(namespace, label_selector=LAB_OBJECTS,
                                                     propagation_policy="Background")
        gone += [f"deployment/{d.metadata.name}" for d in deployments]
    for pod in core.list_namespaced_pod(namespace, label_selector=SERVER_PODS).items:
        _gone_ok(core.delete_namespaced_pod, pod.metadata.name, namespace)
        gone.append(f"pod/{pod.metadata.name}")
    for svc in core.list_namespaced_service(namespace, label_selector=SERVER_PODS).items:
        _gone_ok(core.delete_namespaced_service, svc.metadata.name, namespace)
        gone.append(f"service/{svc.metadata.name}")
    for binding in rbac.list_namespaced_role_binding(namespace).items:
        ref = binding.role_ref
        if ref.kind == "ClusterRole" and ref.name == role:
            _gone_ok(rbac.delete_namespaced_role_binding, binding.metadata.name, namespace)
            gone.append(f"rolebinding/{binding.metadata.name}")
    return gone


def _gone_ok(delete: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """A delete that may meet an object already gone (the hub or the user was quicker)."""
    from kubernetes.client.rest import ApiException

    try:
        delete(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise


def run(api: Callable[[str], Any], hub_namespace: str, role: str, remove_namespaces: bool,
        say: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Do the hook's work; return namespace → what was removed there."""
    core = api("CoreV1Api")
    done: dict[str, list[str]] = {}
    for ns in user_namespaces(core, hub_namespace):
        if remove_namespaces:
            _gone_ok(core.delete_namespace, ns, propagation_policy="Background")
            done[ns] = [f"namespace/{ns}"]
        else:
            done[ns] = clean_namespace(api, ns, role)
        say(f"tfk8s-lab uninstall: {ns}: removed {', '.join(done[ns]) or 'nothing'}"
            + ("" if remove_namespaces else "; the namespace and its claims are kept"))
    if not done:
        say(f"tfk8s-lab uninstall: no user namespace of the hub in {hub_namespace!r}")
    return done


def main(argv: list[str] | None = None) -> int:
    """The hook's command line."""
    parser = argparse.ArgumentParser(prog="python -m tfk8s_hub.uninstall", description=__doc__.split("\n")[0])
    parser.add_argument("--hub-namespace", required=True, help="the release's namespace")
    parser.add_argument("--role", required=True, help="the backend's ClusterRole, bound per user namespace")
    parser.add_argument("--remove-namespaces", action="store_true",
                        help="delete the user namespaces (home claims included) instead of cleaning them")
    args = parser.parse_args(argv)
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api_client = client.ApiClient()
    run(lambda name: getattr(client, name)(api_client), args.hub_namespace, args.role,
        args.remove_namespaces)
    return 0


if __name__ == "__main__":  # pragma: no cover - the hook's entry point
    sys.exit(main())
