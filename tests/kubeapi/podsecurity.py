"""Pod Security Admission, the "baseline" and "restricted" levels (a TEST DOUBLE).

Transcribes ``k8s.io/pod-security-admission/policy``: the namespace's
``pod-security.kubernetes.io/enforce`` label picks the level; each check
gives a reason and a detail; the denial is a 403 ``pods "p" is forbidden:
violates PodSecurity "restricted:latest": <reason> (<detail>), ...``, the
baseline checks first, then the restricted ones, each group in the order of
the real check files.

Checked (baseline): host namespaces, hostPath volumes, host ports,
privileged, non-default capabilities, seccomp ``Unconfined``, procMount,
unsafe sysctls, Windows hostProcess.  Checked (restricted): every baseline
check plus allowPrivilegeEscalation, capabilities (drop ALL, add only
NET_BIND_SERVICE), volume types, runAsNonRoot, runAsUser=0 and
seccompProfile.  Not modelled: AppArmor and SELinux options, version
pinning (every ``enforce-version`` is treated as ``latest``), the
user-namespace relaxation of 1.33+, and the ``warn``/``audit`` modes
(they never refuse).  Pod templates (Deployments) are not checked, as for
real: their pods are, when the controller creates them.
"""

from __future__ import annotations

from . import errors
from .resources import lookup

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                    "persistentVolumeClaim", "projected", "secret"}


def _quote(names) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _plural(word: str, n: int) -> str:
    return word if n == 1 else word + "s"


def _containers(spec: dict) -> list[dict]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _sc(c: dict) -> dict:
    return c.get("securityContext") or {}


def _bad_containers(spec: dict, predicate, detail: str):
    bad = [c["name"] for c in _containers(spec) if predicate(c)]
    if bad:
        return f'{_plural("container", len(bad))} {_quote(bad)} {detail}'
    return None


# -- baseline -------------------------------------------------------------------

def _capabilities_baseline(spec):
    bad, caps = [], []
    for c in _containers(spec):
        added = [a for a in (_sc(c).get("capabilities") or {}).get("add") or []
                 if a not in _BASELINE_CAPABILITIES]
        if added:
            bad.append(c["name"])
            caps += [a for a in added if a not in caps]
    if bad:
        return ("non-default capabilities", f'{_plural("container", len(bad))} {_quote(bad)} '
                f"must not include {_quote(sorted(caps))} in securityContext.capabilities.add")
    return None


def _host_namespaces(spec):
    used = [n for n in ("hostIPC", "hostNetwork", "hostPID") if spec.get(n)]
    return ("host namespaces", ", ".join(used)) if used else None


def _host_path(spec):
    names = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if names:
        return "hostPath volumes", f'{_plural("volume", len(names))} {_quote(names)}'
    return None


def _host_ports(spec):
    bad, ports = [], []
    for c in _containers(spec):
        used = [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c["name"])
            ports += used
    if bad:
        return ("hostPort", f'{_plural("container", len(bad))} {_quote(bad)} '
                f'{"uses" if len(bad) == 1 else "use"} {_plural("hostPort", len(ports))} '
                f"{', '.join(ports)}")
    return None


def _privileged(spec):
    detail = _bad_containers(spec, lambda c: _sc(c).get("privileged") is True,
                             "must not set securityContext.privileged=true")
    return ("privileged", detail) if detail else None


def _proc_mount(spec):
    detail = _bad_containers(spec, lambda c: _sc(c).get("procMount") not in (None, "Default"),
                             'must not set securityContext.procMount to "Unmasked"')
    return ("procMount", detail) if detail else None


def _seccomp_baseline(spec):
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    bad = ["pod"] if pod == "Unconfined" else []
    containers = [c["name"] for c in _containers(spec)
                  if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if containers:
        bad.append(f'{_plural("container", len(containers))} {_quote(containers)}')
    if bad:
        return ("seccompProfile", f"{' and '.join(bad)} must not set "
                'securityContext.seccompProfile.type to "Unconfined"')
    return None


def _sysctls(spec):
    names = [s["name"] for s in (spec.get("securityContext") or {}).get("sysctls") or []
             if s.get("name") not in _SAFE_SYSCTLS]
    return ("forbidden sysctls", ", ".join(names)) if names else None


def _windows_host_process(spec):
    pod = ((spec.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess")
    detail = _bad_containers(
        spec, lambda c: (_sc(c).get("windowsOptions") or {}).get("hostProcess") is True, "")
    if pod or detail:
        return "hostProcess", ""
    return None


# -- restricted -------------------------------------------------------------------

def _allow_privilege_escalation(spec):
    detail = _bad_containers(spec, lambda c: _sc(c).get("allowPrivilegeEscalation") is not False,
                             "must set securityContext.allowPrivilegeEscalation=false")
    return ("allowPrivilegeEscalation != false", detail) if detail else None


def _capabilities_restricted(spec):
    missing, adding, caps = [], [], []
    for c in _containers(spec):
        cap = _sc(c).get("capabilities")
        if cap is None:
            missing.append(c["name"])
            continue
        if "ALL" not in (cap.get("drop") or []):
            missing.append(c["name"])
        extra = [a for a in cap.get("add") or [] if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(c["name"])
            caps += [a for a in extra if a not in caps]
    details = []
    if missing:
        details.append(f'{_plural("container", len(missing))} {_quote(missing)} must set '
                       'securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f'{_plural("container", len(adding))} {_quote(adding)} must not include '
                       f"{_quote(sorted(caps))} in securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec):
    names = sorted(v["name"] for v in spec.get("volumes") or []
                   if not (set(v) - {"name"}) & _ALLOWED_VOLUMES)
    if names:
        return "restricted volume types", f"volumes {names!r} have restricted types".replace(
            "'", '"').replace(",", "")
    return None


def _pod_or_containers(spec, field, good, bad_detail, missing_detail):
    pod_value = (spec.get("securityContext") or {}).get(field)
    setters = []
    pod_ok = False
    if pod_value is not None:
        if good(pod_value):
            pod_ok = True
        else:
            setters.append("pod")
    explicit, implicit = [], []
    for c in _containers(spec):
        value = _sc(c).get(field)
        if value is not None:
            if not good(value):
                explicit.append(c["name"])
        elif not pod_ok:
            implicit.append(c["name"])
    if explicit:
        setters.append(f'{_plural("container", len(explicit))} {_quote(explicit)}')
    if setters:
        return f"{' and '.join(setters)} {bad_detail}"
    if implicit:
        return f'pod or {_plural("container", len(implicit))} {_quote(implicit)} {missing_detail}'
    return None


def _run_as_non_root(spec):
    detail = _pod_or_containers(spec, "runAsNonRoot", lambda v: v is True,
                                "must not set securityContext.runAsNonRoot=false",
                                "must set securityContext.runAsNonRoot=true")
    return ("runAsNonRoot != true", detail) if detail else None


def _run_as_user(spec):
    bad = []
    if (spec.get("securityContext") or {}).get("runAsUser") == 0:
        bad.append("pod")
    containers = [c["name"] for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if containers:
        bad.append(f'{_plural("container", len(containers))} {_quote(containers)}')
    if bad:
        return "runAsUser=0", f"{' and '.join(bad)} must not set runAsUser=0"
    return None


def _seccomp_restricted(spec):
    values = sorted({p.get("type") for p in
                     [(spec.get("securityContext") or {}).get("seccompProfile") or {},
                      *[_sc(c).get("seccompProfile") or {} for c in _containers(spec)]]
                     if p and p.get("type") not in ("RuntimeDefault", "Localhost")})
    detail = _pod_or_containers(
        spec, "seccompProfile", lambda p: p.get("type") in ("RuntimeDefault", "Localhost"),
        f"must not set securityContext.seccompProfile.type to {_quote(values)}",
        'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    return ("seccompProfile", detail) if detail else None


_BASELINE = (_capabilities_baseline, _host_namespaces, _host_path, _host_ports, _privileged,
             _proc_mount, _seccomp_baseline, _sysctls, _windows_host_process)
# hostPathVolumes overlaps restrictedVolumes: restricted runs it only through the latter.
_RESTRICTED = (_allow_privilege_escalation, _capabilities_restricted, _restricted_volumes,
               _run_as_non_root, _run_as_user, _seccomp_restricted)


def violations(spec: dict, level: str) -> list[str]:
    """``reason (detail)`` for every check ``spec`` fails at ``level`` (in the real order)."""
    if level not in ("baseline", "restricted"):
        return []
    checks = [c for c in _BASELINE if not (level == "restricted" and c is _host_path)]
    if level == "restricted":
        checks += _RESTRICTED
    out = []
    for check in checks:
        found = check(spec)
        if found:
            reason, detail = found
            out.append(f"{reason} ({detail})" if detail else reason)
    return out


def admit(namespace: dict, pod: dict) -> None:
    """Refuse ``pod`` (403) if it breaks the level its namespace enforces."""
    level = ((namespace.get("metadata") or {}).get("labels") or {}).get(ENFORCE_LABEL)
    if not level or level == "privileged":
        return
    found = violations(pod.get("spec") or {}, level)
    if found:
        raise errors.forbidden(lookup("pods"), pod["metadata"].get("name"),
                               f'violates PodSecurity "{level}:latest": {", ".join(found)}')
