"""Apply a cluster's manifests with rollback, after a pre-flight quota check.

The root object is created first; every other object then gets an
ownerReference to it, so one delete of the root removes the cluster.  The
JobSet comes last (its pods need the root and the claims); JobSet creates
the pods.  If any request fails — forbidden (403), exists (409),
invalid (422), over quota — everything this launch created is deleted and
:class:`~tfk8s_magics.errors.LaunchFailed` says why in one sentence, with
the API's own message.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

from ...errors import LaunchFailed
from .client import Api, api_reason
from .manifests import owner_reference, with_owner
from .quota import admitted, counts_any, limit_problems, node_problems, pending_pods, quota_problems

Manifest = dict[str, Any]
#: What a JobSet CRD older than v0.7 (no ``failurePolicy.restartStrategy``) makes a launch say.
JOBSET_TOO_OLD = (
    "this cluster runs JobSet older than v0.7, which tfk8s needs (v0.6 keeps parameter "
    "servers and a failed cluster's survivors running until its TTL expires): ask your "
    "administrator to upgrade JobSet to v0.7 or newer (docs/admins); nothing was created"
)
#: The JobSet API (the same as :data:`.jobset.API_VERSION`).
JOBSET_API = "jobset.x-k8s.io/v1alpha2"


def _what(m: Manifest) -> str:
    return f"{m['kind']} {m['metadata']['name']}"


def failure_sentence(e: ApiException, manifest: Manifest, namespace: str) -> str:
    """One sentence saying why the API refused ``manifest``, and what to do."""
    reason = api_reason(e)
    what = _what(manifest)
    if manifest["kind"] == "JobSet" and "restartStrategy" in reason and (
            "unknown field" in reason or "not declared" in reason):
        return JOBSET_TOO_OLD + f" ({reason})"
    admission = _admission_sentence(e.status, reason, what)
    if admission:
        return admission
    if e.status == 403:
        return (f"the notebook's service account may not create {what} in namespace "
                f"{namespace!r} ({reason}); ask your administrator to bind the tfk8s-backend "
                "Role (tfk8s_magics.backends.kubernetes.rbac) to it.")
    if e.status == 409:
        return (f"{what} already exists in namespace {namespace!r} ({reason}); choose another "
                "cluster name or delete the old one with `%tfcluster delete NAME`.")
    if e.status == 422:
        return f"the API rejected {what} as invalid ({reason}); this is a bug, please report it."
    return f"creating {what} failed: the API answered {e.status} ({reason})."


def _admission_sentence(status: int | None, reason: str, what: str) -> str | None:
    """The sentence for a refusal by an admission plugin (quota, LimitRange, Pod Security)."""
    if "admission webhook" in reason:  # JobSet's or Kueue's webhook, not RBAC
        webhook = reason.split('"')[1] if reason.count('"') >= 2 else "an"
        return (f"the {webhook} admission webhook refused {what} ({reason}): the object is not "
                "valid for that controller; check the launch options it names, or ask your "
                "administrator whether the controller's version matches (docs/admins).")
    if "ValidatingAdmissionPolicy" in reason:
        return (f"the namespace's admission policy refused {what} ({reason}); "
                "ask your administrator (docs/admins).")
    if status == 403 and "must specify" in reason:
        return (f"the namespace's ResourceQuota needs every pod to state its resources and "
                f"{what} does not ({reason}): give --cpu and --memory for every role, or ask "
                "your administrator for LimitRange defaults.")
    if status == 403 and "quota" in reason.lower():
        return (f"creating {what} would exceed the namespace's ResourceQuota ({reason}); "
                "ask for fewer tasks or resources, or delete finished clusters.")
    if status == 403 and ("usage per Container" in reason or "usage per Pod" in reason
                          or "limit to request ratio" in reason):
        return (f"the namespace's LimitRange refuses {what} ({reason}): ask for resources "
                "within its bounds (`kubectl describe limitrange`), or ask your "
                "administrator to change them.")
    if status == 403 and "violates PodSecurity" in reason:
        return (f"the namespace's Pod Security level refuses {what} ({reason}): use an image "
                "that runs as a non-root user; the lab's own pods meet the restricted level.")
    if status == 422 and "must be less than or equal to" in reason and "limit" in reason:
        return (f"{what} asks for more than its limit ({reason}), probably a default limit "
                "from the namespace's LimitRange: ask for less (--cpu, --memory), or ask "
                "your administrator to raise the LimitRange's default limit.")
    if status == 422 and "Too long" in reason:
        return (f"{what} is larger than Kubernetes accepts ({reason}): keep large data and "
                "code in files on the /data volume and load them from a small script.")
    return None


def preflight(api: Api, manifests: list[Manifest], check_nodes: bool = False) -> None:
    """Raise :class:`LaunchFailed` if admission would refuse the manifests.

    The pods are given the namespace's LimitRange defaults first, as the API
    server will, then checked against the LimitRanges and the quota.

    Nodes are compared too when ``check_nodes`` (listing nodes needs a
    ClusterRole the per-user Role does not give).
    """
    try:
        ranges = api.list_objects("v1", "LimitRange").get("items", [])
        quotas = [q for q in api.list_objects("v1", "ResourceQuota").get("items", [])
                  if counts_any(q, manifests)]  # e.g. not the quota of cross-namespace affinity
        problems = limit_problems(manifests, ranges)
        pending: list[Manifest] = []
        if quotas:  # the pods other clusters are still to create count as used
            jobsets = api.list_objects(JOBSET_API, "JobSet").get("items", [])
            pods = api.list_objects("v1", "Pod", "jobset.sigs.k8s.io/jobset-name").get("items", [])
            pending = admitted(pending_pods(jobsets, pods), ranges)
        problems += quota_problems(admitted(manifests, ranges), quotas, pending)
    except ApiException as e:
        raise LaunchFailed(
            f"could not read the quota and limit ranges of namespace {api.namespace!r} "
            "before launching: "
            f"{api_reason(e)}."
        ) from e
    if check_nodes:
        try:
            nodes = api.core.list_node(_preload_content=False, _request_timeout=api.timeout)
        except ApiException as e:
            if e.status == 403:
                raise LaunchFailed(
                    "the node check (check_nodes) needs to list the cluster's nodes, which the "
                    f"notebook's service account may not ({api_reason(e)}): ask your "
                    "administrator for a ClusterRole with list on nodes, or launch without "
                    "the node check; nothing was created.") from e
            raise LaunchFailed(f"could not list the cluster's nodes before launching: "
                               f"{api_reason(e)}.") from e
        problems += node_problems(manifests, api._json(nodes).get("items", []))
    if problems:
        raise LaunchFailed(
            "the cluster would not fit, so nothing was created: " + " ".join(problems)
        )


def apply(api: Api, manifests: list[Manifest]) -> list[Manifest]:
    """Create ``manifests`` (root first) with rollback; return the created objects."""
    created: list[Manifest] = []
    current = manifests[0]
    try:
        root = api.create(manifests[0])
        created.append(root)
        owner = owner_reference(root)
        for current in [with_owner(m, owner) for m in manifests[1:]]:
            created.append(api.create(current))
    except ApiException as e:
        sentence = failure_sentence(e, current, api.namespace)
        leftovers = rollback(api, created)
        if leftovers:
            sentence += f" Rolling back left {', '.join(leftovers)}: delete them by hand."
        raise LaunchFailed(sentence) from e
    return created


def rollback(api: Api, created: list[Manifest]) -> list[str]:
    """Delete ``created`` newest first; return what could not be deleted."""
    leftovers = []
    for obj in reversed(created):
        try:
            api.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        except ApiException:
            leftovers.append(_what(obj))
    return leftovers
