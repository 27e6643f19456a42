"""Build the test cluster's binaries from their Go modules, cached by version.

Each :class:`Component` names its binaries and how to build them. A component is built once per
version into ``<cache>/<name>-<version>/`` (written to a temporary directory and renamed, so a
killed build never leaves a half-filled cache entry); a second ``build`` finds it and returns at
once. Only ``go.mod``/``go.sum`` files of ours are in the tree (``devcluster/go/``), never
upstream code or binaries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .versions import HERE, cache_root, versions

GO_DIR = HERE / "go"


@dataclass(frozen=True)
class Component:
    """A set of binaries built together from one module at one pinned version."""

    name: str
    version_key: str  # the key in versions.env
    binaries: tuple[str, ...]
    build: Callable[[str, Path], None] = field(repr=False)  # (version, out dir) -> None

    @property
    def version(self) -> str:
        """The pinned version of this component."""
        return versions()[self.version_key]

    @property
    def dir(self) -> Path:
        """The cache directory of this component's binaries at its pinned version."""
        return cache_root() / f"{self.name}-{self.version}"

    def path(self, binary: str) -> Path:
        """The cached path of one of this component's binaries."""
        return self.dir / binary

    def is_built(self) -> bool:
        """True when every binary of this version is in the cache."""
        return all((self.dir / b).is_file() for b in self.binaries)


def _go_env(cgo: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1" if cgo else "0"
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    print("devcluster: $ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, env=env or _go_env(), check=True)


def kube_ldflags(version: str) -> str:
    """The version ldflags: without them ``/version`` says v0.0.0-master and Kueue refuses to start."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


def _check_module_version(module_dir: Path, module: str, version: str) -> None:
    text = (module_dir / "go.mod").read_text()
    if f"{module} {version}" not in text:
        raise SystemExit(
            f"devcluster: {module_dir / 'go.mod'} does not require {module} {version} (versions.env); "
            f"regenerate it: .venv/bin/python -m devcluster gomod"
        )


def _build_kubernetes(binaries: tuple[str, ...]) -> Callable[[str, Path], None]:
    def build(version: str, out: Path) -> None:
        mod = GO_DIR / "kubernetes"
        _check_module_version(mod, "k8s.io/kubernetes", version)
        pkgs = [f"k8s.io/kubernetes/cmd/{b}" for b in binaries]
        _run(["go", "build", "-trimpath", "-ldflags", kube_ldflags(version), "-o", f"{out}/", *pkgs], cwd=mod)

    return build


def _build_etcd(version: str, out: Path) -> None:
    mod = GO_DIR / "etcd"
    _check_module_version(mod, "go.etcd.io/etcd/server/v3", version)
    _run(
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
            str(out / "etcd"),
            "go.etcd.io/etcd/server/v3",
        ],
        cwd=mod,
    )


def _consumer(
    module: str, pkg: str, binary: str, ldflags: Callable[[str], str] = lambda version: ""
) -> Callable[[str, Path], None]:
    """Build ``pkg`` from the consumer module ``go/<binary>`` that requires ``module`` at the version."""

    def build(version: str, out: Path) -> None:
        mod = GO_DIR / binary
        _check_module_version(mod, module, version)
        flags = " ".join(["-s -w", ldflags(version)]).strip()
        _run(["go", "build", "-trimpath", "-ldflags", flags, "-o", str(out / binary), pkg], cwd=mod)

    return build


CILIUM_MODULE = "github.com/cilium/cilium"
#: the agent and the CNI plugin, with the tags of upstream's Makefile. Not the operator: its package
#: imports sigs.k8s.io/mcs-api/controllers v0.5.2, which the module proxy refuses ("403 Forbidden:
#: This module version is not available"); the enforcer registers the operator's CRDs itself.
CILIUM_BINARIES = {"cilium-agent": "daemon", "cilium-cni": "plugins/cilium-cni"}


def _build_cilium(version: str, out: Path) -> None:
    """Cilium's agent and CNI plugin, its BPF sources (the agent compiles them when it starts) as
    ``lib/bpf``, its CRDs (the operator's embedded copies) as ``crds/`` and its Helm chart (the
    agent's RBAC is rendered from it) as ``chart/``."""
    mod = GO_DIR / "cilium"
    _check_module_version(mod, CILIUM_MODULE, version)
    ldflags = f"-s -w -X {CILIUM_MODULE}/pkg/version.ciliumVersion={version.lstrip('v')}"
    for binary, pkg in CILIUM_BINARIES.items():
        _run(
            ["go", "build", "-trimpath", "-tags", "osusergo", "-ldflags", ldflags, "-o", str(out / binary),
             f"{CILIUM_MODULE}/{pkg}"],
            cwd=mod,
        )  # fmt: skip
    listing = subprocess.run(
        ["go", "mod", "download", "-json", f"{CILIUM_MODULE}@{version}"],
        cwd=mod, capture_output=True, text=True, check=True,
    )  # fmt: skip
    src = Path(json.loads(listing.stdout)["Dir"])
    shutil.copytree(src / "bpf", out / "lib" / "bpf")
    shutil.copytree(src / "install" / "kubernetes" / "cilium", out / "chart")
    (out / "crds").mkdir()
    for crd in sorted((src / "pkg/k8s/apis/cilium.io/client/crds").glob("*/*.yaml")):
        shutil.copyfile(crd, out / "crds" / crd.name)
    for p in out.rglob("*"):  # the module cache's files are read-only
        p.chmod(p.stat().st_mode | 0o200)


def _go_install(
    *pkgs: str, cgo: bool = False, tags: str = "", ldflags: Callable[[str], str] = lambda version: ""
) -> Callable[[str, Path], None]:
    def build(version: str, out: Path) -> None:
        env = _go_env(cgo)
        env.pop("GOFLAGS", None)
        env["GOBIN"] = str(out)
        extra = ["-tags", tags] if tags else []
        flags = " ".join(["-s -w", ldflags(version)]).strip()
        _run(
            ["go", "install", "-trimpath", "-ldflags", flags, *extra, *(f"{pkg}@{version}" for pkg in pkgs)],
            env=env,
        )

    return build


KUBE_CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
KUBE_NODE = ("kubelet", "kube-proxy")
CONTAINERD = ("containerd", "ctr", "containerd-shim-runc-v2")

COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("kubernetes", "KUBERNETES", KUBE_CONTROL_PLANE, _build_kubernetes(KUBE_CONTROL_PLANE)),
        Component("etcd", "ETCD", ("etcd",), _build_etcd),
        Component("kwok", "KWOK", ("kwok",), _go_install("sigs.k8s.io/kwok/cmd/kwok")),
        # JobSet's main package is the module root; see go/jobset/go.mod for why not `go install`.
        Component(
            "jobset", "JOBSET", ("jobset",), _consumer("sigs.k8s.io/jobset", "sigs.k8s.io/jobset", "jobset")
        ),
        Component("kueue", "KUEUE", ("kueue",), _go_install("sigs.k8s.io/kueue/cmd/kueue")),
        # tier 2, the real node (devcluster/node.py)
        Component("kubelet", "KUBERNETES", KUBE_NODE, _build_kubernetes(KUBE_NODE)),
        Component(
            "containerd",
            "CONTAINERD",
            CONTAINERD,
            _go_install(
                *(f"github.com/containerd/containerd/v2/cmd/{b}" for b in CONTAINERD),
                tags="no_btrfs",
                ldflags=lambda v: f"-X github.com/containerd/containerd/v2/version.Version={v}",
            ),
        ),
        # cgo + libseccomp (Debian's libseccomp-dev): without seccomp, no pod passes Pod Security restricted
        Component(
            "runc",
            "RUNC",
            ("runc",),
            _go_install(
                "github.com/opencontainers/runc",
                cgo=True,
                tags="seccomp",
                ldflags=lambda v: f"-X main.version={v.lstrip('v')}",
            ),
        ),
        Component("coredns", "COREDNS", ("coredns",), _go_install("github.com/coredns/coredns")),
        # the NetworkPolicy enforcer of the real nodes (devcluster/enforcer.py)
        Component("cilium", "CILIUM", tuple(CILIUM_BINARIES), _build_cilium),
        # the image registry (devcluster/registry.py): no replace directives, a plain `go install`
        Component(
            "registry",
            "DISTRIBUTION",
            ("registry",),
            _go_install(
                "github.com/distribution/distribution/v3/cmd/registry",
                ldflags=lambda v: f"-X github.com/distribution/distribution/v3/version.version={v}",
            ),
        ),
        # the `glusterfs` class's provisioner (devcluster/storage.py): see go/local-path-provisioner
        Component(
            "local-path-provisioner",
            "LOCAL_PATH_PROVISIONER",
            ("local-path-provisioner",),
            _consumer(
                "github.com/rancher/local-path-provisioner",
                "github.com/rancher/local-path-provisioner",
                "local-path-provisioner",
            ),
        ),
        # the OIDC provider (devcluster/identity.py): see go/dex/go.mod for why a consumer module
        Component(
            "dex", "DEX", ("dex",), _consumer("github.com/dexidp/dex", "github.com/dexidp/dex/cmd/dex", "dex")
        ),
        # the Ingress controller (devcluster/ingress.py): see go/traefik/go.mod for why a consumer module
        Component(
            "traefik",
            "TRAEFIK",
            ("traefik",),
            _consumer(
                "github.com/traefik/traefik/v3",
                "github.com/traefik/traefik/v3/cmd/traefik",
                "traefik",
                ldflags=lambda v: f"-X github.com/traefik/traefik/v3/pkg/version.Version={v.lstrip('v')}",
            ),
        ),
    )
}

# What `scripts/kube up` needs (tier 1: a control plane with kwok nodes, JobSet and Kueue).
TIER1 = ("etcd", "kubernetes", "kwok", "jobset", "kueue")
# What `scripts/kube up --pods` adds (tier 2: a real node running real pods).
TIER2 = ("containerd", "runc", "coredns", "kubelet", "cilium")
# The production-shaped parts `scripts/kube up --pods` starts beside the real nodes (the registry
# they pull from, devcluster/registry.py; the `glusterfs` class's provisioner, devcluster/storage.py;
# the Ingress controller, devcluster/ingress.py; the OIDC provider on the slot's SSO host,
# devcluster/identity.py); built by `scripts/kube build --pods` after the nodes' parts, so that
# `up --pods` builds none of them.
TIER2_PARTS = ("registry", "local-path-provisioner", "traefik", "dex")
# Built first by `scripts/kube build --pods` (scripts/test starts it beside the image builds): the
# longest cold build (Cilium's agent: about 23 min on 2 cores under load, see testing.md).
TIER2_FIRST = ("cilium",)


def ensure(name: str) -> Component:
    """Build ``name`` at its pinned version unless it is already cached; return the component."""
    comp = COMPONENTS[name]
    if comp.is_built():
        return comp
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        raise SystemExit(
            "devcluster: the Go toolchain is missing; install Go >= 1.26 (https://go.dev/doc/install)"
        )
    tmp = comp.dir.with_name(comp.dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    print(
        f"devcluster: building {comp.name} {comp.version} (cold: minutes; cached afterwards)",
        file=sys.stderr,
        flush=True,
    )
    try:
        comp.build(comp.version, tmp)
        missing = [b for b in comp.binaries if not (tmp / b).is_file()]
        if missing:
            raise SystemExit(f"devcluster: building {comp.name} made no {', '.join(missing)}")
        shutil.rmtree(comp.dir, ignore_errors=True)
        tmp.rename(comp.dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"devcluster: built {comp.name} {comp.version} in {time.monotonic() - t0:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return comp


def ensure_all(names: tuple[str, ...] = TIER1) -> dict[str, Component]:
    """Build every named component that is not cached yet."""
    return {n: ensure(n) for n in names}
