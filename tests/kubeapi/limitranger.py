"""LimitRange defaulting and the LimitRanger admission plugin (a TEST DOUBLE).

Transcribes what a real API server does, in its order:

1. creating a LimitRange applies the API's defaulting
   (``SetDefaults_LimitRangeItem``): for a ``Container`` item, a missing
   ``default`` is its ``max``, a missing ``defaultRequest`` its ``default``,
   else its ``min``;
2. creating a pod: decoding defaults a missing request to its limit; the
   LimitRanger's *mutation* (``mergePodResourceRequirements``) fills every
   container's missing requests/limits from each LimitRange's
   ``defaultRequest``/``default`` and records what it set in the
   ``kubernetes.io/limit-ranger`` annotation;
3. validation (422): a request above its limit is ``Invalid`` --
   ``spec.containers[0].resources.requests[cpu]: Invalid value: "4": must be
   less than or equal to cpu limit of 2``;
4. the LimitRanger's *validation* (403): ``min``/``max``/
   ``maxLimitRequestRatio`` per Container and per Pod (sums), with the real
   sentences (``Maximum cpu usage per Container is 2, but limit is 4.``),
   aggregated like ``utilerrors.NewAggregate`` (one error: its text; several:
   ``[a, b]``).

Not modelled: PersistentVolumeClaim items, and the order of several
LimitRanges (the real lister's order is unspecified; we use creation order).
"""

from __future__ import annotations

from decimal import Decimal

from . import errors
from .resources import lookup

ANNOTATION = "kubernetes.io/limit-ranger"


def _q(value) -> Decimal:
    from .quota import parse_quantity

    return parse_quantity(value)


def default_limit_range(obj: dict) -> None:
    """Apply the API's defaulting to a LimitRange being created (in place)."""
    for item in (obj.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        default = item.get("default") or {}
        request = item.get("defaultRequest") or {}
        for key, value in (item.get("max") or {}).items():
            default.setdefault(key, value)
        for key, value in default.items():
            request.setdefault(key, value)
        for key, value in (item.get("min") or {}).items():
            request.setdefault(key, value)
        if default:
            item["default"] = default
        if request:
            item["defaultRequest"] = request


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def default_requests_to_limits(pod: dict) -> None:
    """Decoding's defaulting: a container's missing request defaults to its limit."""
    for c in _containers(pod):
        res = c.get("resources") or {}
        for name, value in (res.get("limits") or {}).items():
            res.setdefault("requests", {}).setdefault(name, value)
        if res:
            c["resources"] = res


def mutate(limit_ranges: list[dict], pod: dict) -> None:
    """The LimitRanger's ``Admit``: merge each LimitRange's container defaults into ``pod``."""
    notes = []
    for lr in limit_ranges:
        defaults = {"limits": {}, "requests": {}}
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") == "Container":
                defaults["requests"].update(item.get("defaultRequest") or {})
                defaults["limits"].update(item.get("default") or {})
        for c in (pod.get("spec") or {}).get("containers") or []:
            res = c.setdefault("resources", {})
            set_by = {}
            for section in ("limits", "requests"):
                current = res.setdefault(section, {})
                set_by[section] = sorted(k for k in defaults[section] if k not in current)
                for key in set_by[section]:
                    current[key] = defaults[section][key]
            for section, word in (("requests", "request"), ("limits", "limit")):
                if set_by[section]:
                    notes.append(f"{', '.join(set_by[section])} {word} for container {c['name']}")
    if notes:
        pod["metadata"].setdefault("annotations", {})[ANNOTATION] = (
            "LimitRanger plugin set: " + "; ".join(notes))


def request_limit_problems(pod: dict, field: str = "spec") -> list[tuple[str, str]]:
    """Validation's ``requests <= limits`` (422 causes), on the mutated pod."""
    problems = []
    spec = pod.get("spec") or {}
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            res = c.get("resources") or {}
            limits = res.get("limits") or {}
            for name, request in sorted((res.get("requests") or {}).items()):
                if name in limits and _q(request) > _q(limits[name]):
                    problems.append((
                        f"{field}.{group}[{i}].resources.requests[{name}]",
                        f'Invalid value: "{request}": must be less than or equal to {name} '
                        f"limit of {limits[name]}"))
    return problems


def _min(kind: str, name: str, bound, requests: dict, limits: dict) -> str | None:
    if name not in requests:
        return f"Minimum {name} usage per {kind} is {bound}.  No request is specified."
    if _q(requests[name]) < _q(bound):
        return f"Minimum {name} usage per {kind} is {bound}, but request is {requests[name]}."
    if name in limits and _q(limits[name]) < _q(bound):
        return f"Minimum {name} usage per {kind} is {bound}, but limit is {limits[name]}."
    return None


def _max(kind: str, name: str, bound, requests: dict, limits: dict) -> str | None:
    if name not in limits:
        return f"Maximum {name} usage per {kind} is {bound}.  No limit is specified."
    if _q(limits[name]) > _q(bound):
        return f"Maximum {name} usage per {kind} is {bound}, but limit is {limits[name]}."
    if name in requests and _q(requests[name]) > _q(bound):
        return f"Maximum {name} usage per {kind} is {bound}, but request is {requests[name]}."
    return None


def _ratio(kind: str, name: str, bound, requests: dict, limits: dict) -> str | None:
    req, lim = requests.get(name), limits.get(name)
    if req is None or _q(req) == 0:
        return (f"{name} max limit to request ratio per {kind} is {bound}, but no request is "
                "specified or request is 0.")
    if lim is None or _q(lim) == 0:
        return (f"{name} max limit to request ratio per {kind} is {bound}, but no limit is "
                "specified or limit is 0.")
    ratio = _q(lim) / _q(req)
    if ratio > _q(bound):
        return (f"{name} max limit to request ratio per {kind} is {bound}, but provided ratio "
                f"is {float(ratio):f}.")
    return None


def _sum(lists: list[dict]) -> dict:
    # Like the plugin's sum(): a key missing from any container is left out.
    keys = {k for values in lists for k in values}
    return {k: str(sum((_q(v[k]) for v in lists), Decimal(0))) for k in keys
            if all(k in v for v in lists)}


def _check(kind: str, item: dict, requests: dict, limits: dict) -> list[str]:
    out = []
    for key, fn in (("min", _min), ("max", _max), ("maxLimitRequestRatio", _ratio)):
        for name, bound in (item.get(key) or {}).items():
            problem = fn(kind, name, bound, requests, limits)
            if problem:
                out.append(problem)
    return out


def validate(limit_ranges: list[dict], pod: dict) -> None:
    """The LimitRanger's ``Validate``: 403 when a bound of any LimitRange is broken."""
    containers = (pod.get("spec") or {}).get("containers") or []
    problems: list[str] = []
    for lr in limit_ranges:
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") == "Container":
                for c in containers:
                    res = c.get("resources") or {}
                    problems += _check("Container", item, res.get("requests") or {},
                                       res.get("limits") or {})
            elif item.get("type") == "Pod":
                res = [c.get("resources") or {} for c in containers]
                problems += _check("Pod", item, _sum([r.get("requests") or {} for r in res]),
                                   _sum([r.get("limits") or {} for r in res]))
    if problems:
        text = problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]"
        raise errors.forbidden(lookup("pods"), pod["metadata"].get("name"), text)
