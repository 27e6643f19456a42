"""RBAC enforcement of the fake Kubernetes API server (a TEST DOUBLE).

Models one ServiceAccount bound (by a RoleBinding) to one namespaced Role:
exactly the position of a notebook backend running in a user's namespace.
The request attributes and the denial message follow the real authorizer
(``k8s.io/apiserver`` ``forbiddenMessage``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestAttributes:
    """What the authorizer sees of a resource request."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None

    @property
    def resource_path(self) -> str:
        """``pods`` or ``pods/log``: the form RBAC rules and messages use."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _rule_allows(rule: dict, attrs: RequestAttributes) -> bool:
    groups = rule.get("apiGroups") or []
    resources = rule.get("resources") or []
    verbs = rule.get("verbs") or []
    names = rule.get("resourceNames") or []
    if "*" not in groups and attrs.group not in groups:
        return False
    wanted = attrs.resource_path
    if not (wanted in resources or "*" in resources
            or (attrs.subresource and f"*/{attrs.subresource}" in resources)):
        return False
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    # resourceNames can only match requests that name an object: a rule with
    # resourceNames never authorizes list/watch/create/deletecollection.
    if names and (not attrs.name or attrs.name not in names):
        return False
    return True


class RoleAuthorizer:
    """Authorizes requests of one ServiceAccount against one bound Role."""

    def __init__(self, role: dict, namespace: str, service_account: str = "default"):
        self.role = role
        self.namespace = namespace
        self.service_account = service_account

    @property
    def username(self) -> str:
        """The ServiceAccount's user name, as the apiserver reports it."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def allows(self, attrs: RequestAttributes) -> bool:
        """Whether the Role grants the request (a Role never grants cluster scope)."""
        if attrs.namespace != self.namespace:
            return False
        return any(_rule_allows(rule, attrs) for rule in self.role.get("rules") or [])

    def denial(self, attrs: RequestAttributes) -> str:
        """The "User ... cannot ..." sentence of a real Forbidden answer."""
        where = (f'in the namespace "{attrs.namespace}"' if attrs.namespace
                 else "at the cluster scope")
        return (f'User "{self.username}" cannot {attrs.verb} resource "{attrs.resource_path}" '
                f'in API group "{attrs.group}" {where}')
