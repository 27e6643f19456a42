"""Pod templates, exactly as rendered, turned into ``podman run`` arguments (a TEST HARNESS).

:func:`pod_instances` finds the pods a set of rendered objects asks for:
bare ``Pod`` objects (the Kubernetes backend today) and the pods of a
``JobSet`` (``replicatedJobs[].template.spec.template``, one per job index
and completion index, with the names, labels, annotations and
``JOB_COMPLETION_INDEX`` the JobSet and Job controllers give them).

:func:`container_plan` maps one pod to podman: image, command, args, env
(``value``, ``valueFrom.fieldRef``, ``configMapKeyRef`` and the API's
``$(VAR)`` expansion; ``envFrom`` a Secret or ConfigMap given among the
objects), init containers (each its own container, run to its end
first), ``workingDir``, security contexts (user and group,
``runAsNonRoot``, ``fsGroup``, read-only root filesystem, capabilities,
no privilege escalation), resources (memory and CPU limits), volumes
(``emptyDir`` → tmpfs, claims → podman volumes shared by every pod that
names them, ConfigMaps → read-only files), the exec readiness probe, and
the DNS name a headless Service promises (``hostname.subdomain`` → a
network alias, with Kubernetes' search path and ``ndots:5``).

Every field it does not know how to map raises :class:`Unmappable`: a pod
that runs here runs as written, never with a field silently dropped.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_PREFIX = "jobset.sigs.k8s.io/"


class Unmappable(Exception):
    """A pod field this harness cannot reproduce with podman (the test must not go on)."""


@dataclass
class PodInstance:
    """One pod as the API server would hold it: metadata plus the template's spec."""

    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: Manifest
    #: Env the controllers add to every container (a Job's JOB_COMPLETION_INDEX).
    injected_env: list[Manifest] = field(default_factory=list)
    #: The name of the headless Service a controller creates for it (JobSet), if any.
    controller_service: str | None = None


def pod_instances(objects: Iterable[Manifest]) -> list[PodInstance]:
    """Every pod the rendered ``objects`` ask for: bare Pods and the pods of JobSets."""
    out: list[PodInstance] = []
    for obj in objects:
        if obj.get("kind") == "Pod":
            meta = obj["metadata"]
            out.append(PodInstance(meta["name"], meta.get("namespace", "default"),
                                   dict(meta.get("labels", {})), dict(meta.get("annotations", {})),
                                   copy.deepcopy(obj["spec"])))
        elif obj.get("kind") == "JobSet":
            out += list(_jobset_pods(obj))
        elif obj.get("kind") == "Deployment":
            meta, template = obj["metadata"], obj["spec"]["template"]
            if obj["spec"].get("replicas", 1) != 1:
                raise Unmappable(f"Deployment {meta['name']}: replicas != 1 are not mapped")
            tmeta = template.get("metadata") or {}
            out.append(PodInstance(f"{meta['name']}-0", meta.get("namespace", "default"),
                                   dict(tmeta.get("labels", {})), dict(tmeta.get("annotations", {})),
                                   copy.deepcopy(template["spec"])))
    return out


def _jobset_pods(jobset: Manifest) -> Iterator[PodInstance]:
    """The pods of a JobSet, named and labelled as the JobSet and Job controllers do.

    Job ``<jobset>-<rjob>-<jobIndex>``; pod hostname ``<job>-<completionIndex>``
    in the subdomain ``spec.network.subdomain`` (default: the JobSet's name),
    whose headless Service the JobSet controller creates when
    ``enableDNSHostnames`` is not false.
    """
    meta, spec = jobset["metadata"], jobset["spec"]
    network = spec.get("network") or {}
    dns = network.get("enableDNSHostnames", True)
    subdomain = network.get("subdomain") or meta["name"]
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        if job_spec.get("completionMode", "Indexed") != "Indexed":
            raise Unmappable(f"replicatedJob {rjob['name']}: only Indexed Jobs are mapped")
        completions = int(job_spec.get("completions", job_spec.get("parallelism", 1)))
        template = job_spec["template"]
        for job_index in range(int(rjob.get("replicas", 1))):
            job = f"{meta['name']}-{rjob['name']}-{job_index}"
            for index in range(completions):
                pod_spec = copy.deepcopy(template["spec"])
                tmeta = template.get("metadata") or {}
                labels = {
                    **tmeta.get("labels", {}),
                    JOBSET_PREFIX + "jobset-name": meta["name"],
                    JOBSET_PREFIX + "replicatedjob-name": rjob["name"],
                    JOBSET_PREFIX + "replicatedjob-replicas": str(rjob.get("replicas", 1)),
                    JOBSET_PREFIX + "job-index": str(job_index),
                    JOBSET_PREFIX + "restart-attempt": "0",  # the first run
                    "job-name": job,
                    COMPLETION_INDEX: str(index),
                }
                annotations = {**tmeta.get("annotations", {}), **labels}
                if dns:
                    pod_spec.setdefault("hostname", f"{job}-{index}")
                    pod_spec.setdefault("subdomain", subdomain)
                env = [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                    "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}]
                yield PodInstance(f"{job}-{index}", meta.get("namespace", "default"), labels,
                                  annotations, pod_spec, env, subdomain if dns else None)


# ---------------------------------------------------------------- the mapping

_POD_FIELDS = {"hostname", "subdomain", "restartPolicy", "automountServiceAccountToken",
               "enableServiceLinks", "securityContext", "containers", "volumes",
               "serviceAccountName", "terminationGracePeriodSeconds", "dnsPolicy",
               "initContainers"}
_CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "workingDir", "env",
                     "envFrom",
                     "livenessProbe",
                     "ports", "readinessProbe", "securityContext", "volumeMounts", "resources",
                     "terminationMessagePolicy", "terminationMessagePath"}
_POD_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy",
                 "seccompProfile", "supplementalGroups"}
_CONTAINER_SECURITY = {"allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities",
                       "runAsNonRoot", "runAsUser", "runAsGroup", "privileged", "seccompProfile"}


@dataclass
class ContainerPlan:
    """What to create and run for one pod."""

    pod: PodInstance
    container: str
    image: str
    run_args: list[str]
    #: claim name -> read-only; podman volumes every pod naming the claim shares.
    claims: dict[str, bool]
    #: host-side files to write before the run: relative dir -> {file: (text, mode)}
    config_files: dict[str, dict[str, tuple[str, int]]]
    #: ``podman exec`` argv of the readiness probe, if any.
    readiness: list[str] | None
    #: The DNS names the Kubernetes objects promise for this pod.
    dns_names: list[str]
    fs_group: int | None
    uid: int | None
    #: The pod's init containers, each run to exit 0, in order, before this one starts.
    init: list[ContainerPlan] = field(default_factory=list)


def refuse(what: str, value: Any) -> None:
    """Raise :class:`Unmappable` for ``what`` = ``value``."""
    raise Unmappable(f"{what} = {value!r} cannot be reproduced with podman here")


def _check_keys(where: str, obj: Manifest, allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            refuse(f"{where}.{key}", obj[key])


def promised_names(pod: PodInstance, objects: list[Manifest], cluster_domain: str,
                   unenforced: Iterable[str] = ()) -> list[str]:
    """The DNS names the rendered Services promise for ``pod``.

    * ``<hostname>.<subdomain>.<ns>.svc.<domain>`` when a headless Service named
      ``subdomain`` selects the pod (or its controller creates one);
    * ``<service>.<ns>.svc.<domain>`` for a ClusterIP Service that selects this pod
      only and whose ports are its target ports (a network alias cannot translate
      ports, so any other Service is refused unless ``Service/<name>`` is in ``unenforced``).
    """
    names = []
    host, sub = pod.spec.get("hostname"), pod.spec.get("subdomain")
    headless = bool(host and sub and sub == pod.controller_service)
    for obj in objects:
        if obj.get("kind") != "Service" or obj["metadata"].get("namespace", "default") != pod.namespace:
            continue
        spec = obj.get("spec", {})
        sel = spec.get("selector") or {}
        if not sel or not all(pod.labels.get(k) == v for k, v in sel.items()):
            continue
        name = obj["metadata"]["name"]
        if spec.get("clusterIP") == "None":
            headless = headless or bool(host and sub == name)
            continue
        if spec.get("type", "ClusterIP") != "ClusterIP":
            refuse(f"Service {name}.spec.type", spec["type"])
        ports = {p.get("name"): p["containerPort"]
                 for c in pod.spec["containers"] for p in c.get("ports", [])}
        if f"Service/{name}" in unenforced:
            continue
        for port in spec.get("ports", []):
            target = port.get("targetPort", port["port"])
            if ports.get(target, target) != port["port"]:
                refuse(f"Service {name} port {port['port']} -> targetPort (no port translation here)", target)
        names.append(f"{name}.{pod.namespace}.svc.{cluster_domain}")
    if headless:
        names.insert(0, f"{host}.{sub}.{pod.namespace}.svc.{cluster_domain}")
    return names


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?$")
_FACTORS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
            "G": 10**9, "T": 10**12, "m": 10**-3}


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (``2Gi``, ``500m``, ``1``) as a number."""
    m = _QUANTITY.match(str(value))
    if not m:
        refuse("quantity", value)
    return float(m.group(1)) * _FACTORS[m.group(2)]


def expand(text: str, env: dict[str, str]) -> str:
    """The API's ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _field_ref(pod: PodInstance, path: str) -> str:
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        source = pod.labels if m.group(1) == "labels" else pod.annotations
        if m.group(2) not in source:
            refuse(f"fieldRef {path} (no such key on the pod)", path)
        return source[m.group(2)]
    simple = {"metadata.name": pod.name, "metadata.namespace": pod.namespace,
              "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default")}
    if path not in simple:
        refuse("env valueFrom.fieldRef.fieldPath", path)
    return simple[path]


def _env_from(pod: PodInstance, container: Manifest, objects: list[Manifest]) -> dict[str, str]:
    """``envFrom``: every key of a Secret or ConfigMap that is a valid variable name (the
    kubelet skips the others); a missing one is the pod's CreateContainerConfigError."""
    import base64

    out: dict[str, str] = {}
    for source in container.get("envFrom", []):
        _check_keys("envFrom[]", source, {"secretRef", "configMapRef"})
        if "secretRef" in source:
            ref = source["secretRef"]
            _check_keys("envFrom[].secretRef", ref, {"name"})
            secret = _secret(objects, pod.namespace, ref["name"])
            data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
            data.update(secret.get("stringData") or {})
        else:
            ref = source["configMapRef"]
            _check_keys("envFrom[].configMapRef", ref, {"name"})
            data = dict(_configmap(objects, pod.namespace, ref["name"]).get("data") or {})
        out.update({k: v for k, v in data.items() if re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", k)})
    return out


def _env(pod: PodInstance, container: Manifest, objects: list[Manifest]) -> dict[str, str]:
    out: dict[str, str] = _env_from(pod, container, objects)
    for item in [*pod.injected_env, *container.get("env", [])]:
        _check_keys("env[]", item, {"name", "value", "valueFrom"})
        if "valueFrom" in item:
            src = item["valueFrom"]
            if set(src) == {"fieldRef"}:
                value = _field_ref(pod, src["fieldRef"]["fieldPath"])
            elif set(src) == {"configMapKeyRef"}:
                ref = src["configMapKeyRef"]
                value = _configmap(objects, pod.namespace, ref["name"])["data"][ref["key"]]
            elif set(src) == {"secretKeyRef"}:
                ref = src["secretKeyRef"]
                value = _secret_value(objects, pod.namespace, ref["name"], ref["key"])
            else:
                refuse(f"env {item['name']}.valueFrom", src)
        else:
            value = expand(str(item.get("value", "")), out)
        out[item["name"]] = value
    return out


def _configmap(objects: list[Manifest], namespace: str, name: str) -> Manifest:
    for obj in objects:
        meta = obj.get("metadata", {})
        if obj.get("kind") == "ConfigMap" and meta.get("name") == name and \
                meta.get("namespace", "default") == namespace:
            return obj
    raise Unmappable(f"ConfigMap {name!r} is not among the rendered objects (nothing would mount)")


def _secret(objects: list[Manifest], namespace: str, name: str) -> Manifest:
    for obj in objects:
        meta = obj.get("metadata", {})
        if obj.get("kind") == "Secret" and meta.get("name") == name and \
                meta.get("namespace", "default") == namespace:
            return obj
    raise Unmappable(f"Secret {name!r} is not among the given objects: the pod would wait in "
                     "CreateContainerConfigError")


def _secret_value(objects: list[Manifest], namespace: str, name: str, key: str) -> str:
    import base64

    for obj in objects:
        meta = obj.get("metadata", {})
        if obj.get("kind") == "Secret" and meta.get("name") == name and \
                meta.get("namespace", "default") == namespace:
            if key in (obj.get("stringData") or {}):
                return obj["stringData"][key]
            return base64.b64decode(obj["data"][key]).decode()
    raise Unmappable(f"Secret {name!r} is not among the rendered objects")


def _claim_names(objects: list[Manifest], namespace: str) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o.get("kind") == "PersistentVolumeClaim"
            and o["metadata"].get("namespace", "default") == namespace}


def _security(
    pod: PodInstance, container: Manifest, image_user: str
) -> tuple[list[str], int | None, int | None]:
    """``--user``, ``--group-add``, ``--read-only``, ``--cap-*`` … from both security contexts."""
    psc = pod.spec.get("securityContext") or {}
    csc = container.get("securityContext") or {}
    _check_keys("pod.securityContext", psc, _POD_SECURITY)
    _check_keys("container.securityContext", csc, _CONTAINER_SECURITY)
    for sc in (psc, csc):
        seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
        if seccomp != "RuntimeDefault":  # podman's default profile is the runtime default
            refuse("seccompProfile.type", seccomp)
    if csc.get("privileged"):
        refuse("securityContext.privileged", True)
    if psc.get("fsGroupChangePolicy", "OnRootMismatch") not in ("OnRootMismatch", "Always"):
        refuse("fsGroupChangePolicy", psc["fsGroupChangePolicy"])
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup"))
    args: list[str] = []
    effective = str(uid) if uid is not None else (image_user.split(":")[0] or "0")
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
        # The kubelet refuses to start it (CreateContainerConfigError) unless the uid is known non-root.
        if not effective.isdigit() or int(effective) == 0:
            raise Unmappable(f"runAsNonRoot with user {effective!r}: Kubernetes would not start this pod")
    if uid is not None:
        args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
    elif gid is not None:
        refuse("runAsGroup without runAsUser", gid)
    fs_group = psc.get("fsGroup")
    for g in [*([fs_group] if fs_group is not None else []), *psc.get("supplementalGroups", [])]:
        args += ["--group-add", str(g)]
    if csc.get("readOnlyRootFilesystem"):
        # only what the pod mounts is writable: no tmpfs of podman's own on /tmp, /run, /var/tmp
        args += ["--read-only", "--read-only-tmpfs=false"]
    if csc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    caps = csc.get("capabilities") or {}
    _check_keys("capabilities", caps, {"drop", "add"})
    args += [a for c in caps.get("drop", []) for a in ("--cap-drop", c)]
    args += [a for c in caps.get("add", []) for a in ("--cap-add", c)]
    return args, fs_group, int(effective) if effective.isdigit() else None


def _resources(container: Manifest) -> list[str]:
    res = container.get("resources") or {}
    _check_keys("resources", res, {"requests", "limits"})
    # requests are a scheduler's input: one machine schedules nothing (accepted, not enforced)
    for key in res.get("requests", {}):
        if key not in ("cpu", "memory"):
            refuse(f"resources.requests[{key}]", res["requests"][key])
    args = []
    for key, value in (res.get("limits") or {}).items():
        if key == "memory":
            args += ["--memory", str(int(quantity(value)))]
        elif key == "cpu":
            args += ["--cpus", f"{quantity(value):g}"]
        else:
            refuse(f"resources.limits[{key}] (no such device here)", value)
    return args


def _volumes(pod: PodInstance, container: Manifest, objects: list[Manifest],
             existing_claims: Iterable[str]) -> tuple[list[str], dict[str, bool], dict]:
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    known_claims = _claim_names(objects, pod.namespace) | set(existing_claims)
    args: list[str] = []
    claims: dict[str, bool] = {}
    files: dict[str, dict[str, tuple[str, int]]] = {}
    for mount in container.get("volumeMounts", []):
        _check_keys("volumeMounts[]", mount, {"name", "mountPath", "readOnly", "subPath"})
        vol = dict(volumes[mount["name"]])
        path, ro = mount["mountPath"], bool(mount.get("readOnly"))
        vol.pop("name")
        (kind, source), = vol.items()
        if mount.get("subPath") and kind != "configMap":
            refuse(f"volumeMounts[{mount['name']}].subPath on a {kind}", mount["subPath"])
        if kind == "emptyDir":
            _check_keys("emptyDir", source or {}, {"medium", "sizeLimit"})
            opts = f"type=tmpfs,destination={path},tmpfs-mode=0777"  # the kubelet makes emptyDirs 0777
            if (source or {}).get("sizeLimit"):
                opts += f",tmpfs-size={int(quantity(source['sizeLimit']))}"
            args += ["--mount", opts + (",ro=true" if ro else "")]
        elif kind == "persistentVolumeClaim":
            _check_keys("persistentVolumeClaim", source, {"claimName", "readOnly"})
            claim = source["claimName"]
            if claim not in known_claims:
                raise Unmappable(f"claim {claim!r} is neither rendered nor given as existing: "
                                 "the pod would stay Pending")
            ro = ro or bool(source.get("readOnly"))
            claims[claim] = claims.get(claim, True) and ro
            args += ["-v", f"@claim:{claim}:{path}:{'ro' if ro else 'rw'}"]
        elif kind == "configMap":
            _check_keys("configMap", source, {"name", "items", "defaultMode", "optional"})
            data = _configmap(objects, pod.namespace, source["name"]).get("data", {})
            mode = int(source.get("defaultMode", 0o644))
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            rel = f"cm-{pod.name}-{mount['name']}-{len(files)}"
            files[rel] = {}
            for item in items:
                _check_keys("configMap.items[]", item, {"key", "path", "mode"})
                files[rel][item["path"]] = (data[item["key"]], int(item.get("mode", mode)))
            if mount.get("subPath"):  # one file of the volume at mountPath
                args += ["-v", f"@files:{rel}/{mount['subPath']}:{path}:ro"]
            else:
                args += ["-v", f"@files:{rel}:{path}:ro"]  # ConfigMap volumes are always read-only
        else:
            refuse(f"volume {mount['name']} of kind", kind)
    return args, claims, files


def _probe(c: Manifest, probe: Manifest | None, what: str) -> list[str] | None:
    """An exec probe's argv; an httpGet or tcpSocket probe as the same request from inside
    the pod (the kubelet sends it to the pod's IP; here python3 in the image sends it)."""
    if probe is None:
        return None
    _check_keys(what, probe, {"exec", "httpGet", "tcpSocket", "periodSeconds", "failureThreshold",
                              "initialDelaySeconds", "timeoutSeconds", "successThreshold"})
    if "exec" in probe:
        return list(probe["exec"]["command"])
    if "tcpSocket" in probe:
        port = probe["tcpSocket"]["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in c.get("ports", []) if p.get("name") == port)
        return ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 5)"]
    if "httpGet" in probe:
        get = probe["httpGet"]
        _check_keys(f"{what}.httpGet", get, {"path", "port", "scheme"})
        port = get["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in c.get("ports", []) if p.get("name") == port)
        url = f"http://127.0.0.1:{port}{get.get('path', '/')}"
        return ["python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"]
    refuse(what, probe)
    return None


def container_plan(pod: PodInstance, objects: list[Manifest], *, prefix: str, network: str,
                   image_user: str = "", cluster_domain: str = "cluster.local",
                   existing_claims: Iterable[str] = (), unenforced: Iterable[str] = (),
                   _init: Manifest | None = None) -> ContainerPlan:
    """How to run ``pod`` with podman, or :class:`Unmappable` naming the first field it cannot map.

    ``-v @claim:NAME:…`` and ``-v @files:DIR:…`` in ``run_args`` are placeholders the
    runner replaces with the podman volume of claim NAME and the host dir of DIR.
    ``unenforced`` names what the caller accepts to go without, explicitly:
    ``livenessProbe`` (never run), ``serviceAccountToken`` (no API server, no token),
    ``enableServiceLinks`` (no Service variables) and ``Service/<name>`` (no alias for it).
    """
    unenforced = set(unenforced)
    spec = pod.spec
    _check_keys("pod.spec", spec, _POD_FIELDS)
    restart = {"Never": "no", "OnFailure": "on-failure", "Always": "always"}
    if spec.get("restartPolicy", "Always") not in restart:
        refuse("restartPolicy", spec["restartPolicy"])
    if spec.get("automountServiceAccountToken") is not False and "serviceAccountToken" not in unenforced:
        refuse("automountServiceAccountToken (no API server token here)",
               spec.get("automountServiceAccountToken"))
    if spec.get("enableServiceLinks") is not False and "enableServiceLinks" not in unenforced:
        refuse("enableServiceLinks (Service environment variables)", spec.get("enableServiceLinks"))
    if spec.get("dnsPolicy", "ClusterFirst") != "ClusterFirst":
        refuse("dnsPolicy", spec["dnsPolicy"])
    if len(spec["containers"]) != 1:
        refuse("containers (one per pod is mapped)", [c["name"] for c in spec["containers"]])
    (c,) = spec["containers"] if _init is None else (_init,)
    _check_keys("container", c, _CONTAINER_FIELDS)
    if c.get("imagePullPolicy", "IfNotPresent") not in ("IfNotPresent", "Never"):
        refuse("imagePullPolicy (no registry here)", c["imagePullPolicy"])
    name = f"{prefix}-{pod.name}" + ("" if _init is None else f"-init-{c['name']}")
    # An init container runs to its end: never restarted in place (restartPolicy Never here).
    args = ["--name", name, "--network", network, "--pull", "never",
            "--restart", restart[spec.get("restartPolicy", "Always")] if _init is None else "no",
            "--label", f"tfk8s.test-run={prefix}", "--hostname", spec.get("hostname") or pod.name]
    if _init is not None and (c.get("readinessProbe") or c.get("livenessProbe")):
        refuse(f"initContainers[{c['name']}] probes (the API server refuses them)", c["name"])
    dns = promised_names(pod, objects, cluster_domain, unenforced) if _init is None else []
    args += [a for n in dns for a in ("--network-alias", n)]
    # The resolv.conf of a ClusterFirst pod: its namespace first, then the cluster, ndots:5.
    for search in (f"{pod.namespace}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain):
        args += ["--dns-search", search]
    args += ["--dns-option", "ndots:5",
             "--stop-timeout", str(spec.get("terminationGracePeriodSeconds", 30))]
    sec, fs_group, uid = _security(pod, c, image_user)
    args += sec + _resources(c)
    vol_args, claims, files = _volumes(pod, c, objects, existing_claims)
    args += vol_args
    env = _env(pod, c, objects)
    for k, v in env.items():
        args += ["--env", f"{k}={v}"]
    if c.get("workingDir"):
        args += ["--workdir", c["workingDir"]]
    command = [expand(x, env) for x in c.get("command", [])]
    cargs = [expand(x, env) for x in c.get("args", [])]
    if command:
        import json

        args += ["--entrypoint", json.dumps(command)]  # podman then drops the image's CMD too
    readiness = _probe(c, c.get("readinessProbe"), "readinessProbe")
    if c.get("livenessProbe") is not None and "livenessProbe" not in unenforced:
        refuse("livenessProbe (not run here; pass unenforced={'livenessProbe'} to accept that)",
               c["livenessProbe"])
    for port in c.get("ports", []):
        # containers on one network reach each other's ports, as pods do; nothing is published
        _check_keys("ports[]", port, {"name", "containerPort", "protocol"})
        if port.get("protocol", "TCP") != "TCP":
            refuse("ports[].protocol", port["protocol"])
    init = [] if _init is not None else [
        container_plan(pod, objects, prefix=prefix, network=network, image_user=image_user,
                       cluster_domain=cluster_domain, existing_claims=existing_claims,
                       unenforced=unenforced, _init=ic)
        for ic in spec.get("initContainers", [])]
    return ContainerPlan(pod, name, c["image"], args + [c["image"], *cargs], claims, files,
                         readiness, dns, fs_group, uid, init)
