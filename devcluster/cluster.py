"""A real Kubernetes control plane with kwok nodes, JobSet and Kueue, as processes on this machine.

``up()`` starts, in order: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
(playing nodes and pod phases for nodes annotated ``kwok.x-k8s.io/node=fake``), then JobSet's and
Kueue's controllers with their CRDs and webhook configurations. Every address is loopback: the API
server and the webhooks listen on 127.0.0.1, webhook configurations name
``https://127.0.0.1:PORT/path`` instead of a Service, and kwok's invented pod IPs are routed
``unreachable`` so nothing for them can leave the machine.

The state (certificates, kubeconfigs, ports, logs, etcd's data) is one directory, by default
``~/.cache/tfk8s/devcluster/cluster``; ``down()`` stops every process and removes it.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from . import build
from .hostfiles import free_port
from .pki import CA, service_account_keys
from .procs import Procs
from .versions import cache_root, versions

SERVICE_RANGE = "10.96.0.0/16"
KWOK_POD_RANGE = "10.0.0.0/24"  # kwok's invented pod IPs: routed unreachable while the cluster runs
KWOK_NODE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
# A test (or a person) ends a kwok pod by labelling it: the label's value is the exit code.
EXIT_LABEL = "kwok.tfk8s.dev/exit"

CONTROL_PLANE_ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "jobset",
    "kueue",
)


class ClusterError(RuntimeError):
    """The cluster could not be started or reached; the message says what to do."""


def default_dir() -> Path:
    """The cluster's state directory (``$TFK8S_KUBE_DIR`` or ``<cache>/cluster``)."""
    return Path(os.environ.get("TFK8S_KUBE_DIR") or cache_root() / "cluster")


def _module_dir(module: str, version: str) -> Path:
    """The module's download (for its config/ tree), fetched through the Go module proxy."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, check=True
    )
    return Path(json.loads(out.stdout)["Dir"])


def _kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    crt: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
    user: str = "admin",
) -> Path:
    u: dict = {}
    if crt:
        u = {"client-certificate": str(crt), "client-key": str(key)}
    if token:
        u = {"token": token}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "tfk8s-devcluster",
        "clusters": [
            {"name": "tfk8s-devcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": u}],
        "contexts": [{"name": "tfk8s-devcluster", "context": {"cluster": "tfk8s-devcluster", "user": user}}],
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


class Cluster:
    """One test cluster, described by its state directory."""

    def __init__(self, root: Path | None = None):
        self.root = root or default_dir()
        self.pki = self.root / "pki"
        self.procs = Procs(self.root)
        self.state_file = self.root / "cluster.json"
        self.kubeconfig = self.root / "admin.kubeconfig"

    # -- state -------------------------------------------------------------------------------
    def state(self) -> dict:
        """Ports and versions of the running cluster (empty when none was started here)."""
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.state()['apiserver_port']}"

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context that trusts the cluster CA and presents the admin certificate."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` from the API server as admin."""
        req = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        """Run the cluster's own kubectl as admin."""
        kubectl = build.COMPONENTS["kubernetes"].path("kubectl")
        return subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
        )

    def apply(self, objs: list[dict]) -> None:
        """Server-side apply ``objs`` as admin."""
        docs = yaml.safe_dump_all(objs)
        r = self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=docs, check=False)
        if r.returncode:
            raise ClusterError(f"kubectl apply failed: {r.stderr.strip()}")

    def running(self) -> bool:
        """True when every control-plane process runs and the API server answers /readyz."""
        if not self.state() or not all(self.procs.alive(n) for n in CONTROL_PLANE_ORDER):
            return False
        try:
            return self.get("/readyz", timeout=3)[0] == 200
        except OSError:
            return False

    # -- up ----------------------------------------------------------------------------------
    def up(self, nodes: int = 2, timeout: float = 240.0, pods: bool = False) -> None:
        """Build what is missing, then start the whole cluster; raise :class:`ClusterError` on failure.

        ``pods``: also start real nodes on this machine (tier 2, :mod:`devcluster.node`).
        """
        if self.running():
            print(f"devcluster: already running ({self.server})", file=sys.stderr)
            if pods:
                self._node_up()
            return
        self.down(quiet=True)  # a half-started or dead cluster: start from nothing
        comps = build.ensure_all()
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        st = {
            "versions": versions(),
            "apiserver_port": free_port(),
            "etcd_port": free_port(),
            "etcd_peer_port": free_port(),
            "jobset_webhook_port": free_port(),
            "kueue_webhook_port": free_port(),
            "jobset_health_port": free_port(),
            "kueue_health_port": free_port(),
        }
        self.state_file.write_text(json.dumps(st, indent=1))
        self._certs()
        try:
            self._route_kwok_range(add=True)
            self._start_etcd(comps["etcd"])
            self._start_apiserver(comps["kubernetes"])
            self._wait(lambda: self.get("/readyz", timeout=2)[0] == 200, "kube-apiserver", timeout)
            self._start_controllers(comps["kubernetes"])
            self.apply([STORAGE_CLASS, *self._volumes(PV_POOL)])
            self._start_kwok(comps["kwok"], nodes)
            self._start_jobset(comps["jobset"], timeout)
            self._start_kueue(comps["kueue"], timeout)
            self.procs.start(
                "keeper",
                [sys.executable, "-m", "devcluster.keeper", str(self.root)],
                env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
            )
        except BaseException:
            self.down(quiet=True, keep_logs=True)
            raise
        print(
            f"devcluster: up in {time.monotonic() - t0:.1f} s — {self.server}; KUBECONFIG={self.kubeconfig}",
            file=sys.stderr,
        )
        if pods:
            self._node_up()

    def _node_up(self) -> None:
        from . import identity, ingress, network, node, storage
        from .images import LAB_IMAGES

        def log(line: str) -> None:
            print(line, file=sys.stderr)

        if node.running(self):
            log(f"devcluster: real nodes {', '.join(node.NODE_NAMES)} already running")
        else:
            self._start_nodes(log)
        # the Gluster volume after the nodes: its server listens on the node bridge they made
        try:
            storage.up(self, node.slot_of(self), helper_image=LAB_IMAGES[0], log=log)
        except storage.StorageError as e:
            raise ClusterError(f"the glusterfs storage did not start: {e}") from e
        try:
            ingress.up(self, log=log)  # in the first node's namespace, on its address
        except ingress.IngressError as e:
            raise ClusterError(f"the Ingress controller did not start: {e}") from e
        # Dex on the slot's SSO host: one issuer URL for the hub's pod and a browser on this host
        slot = node.slot_of(self)
        try:
            network.sso_up(slot, [n.net for n in node.layouts(self)])
        except network.NetworkError as e:
            raise ClusterError(f"the SSO host's network on {slot.sso_ip} was not made: {e}") from e
        try:
            identity.up(
                self,
                [f"https://{ingress.HOST}/hub/oauth_callback"],
                host=slot.sso_ip,
                netns=slot.sso_netns,
                log=log,
            )
        except identity.IdentityError as e:
            raise ClusterError(f"the OIDC provider (Dex) did not start: {e}") from e

    def _start_nodes(self, log) -> None:
        """:func:`devcluster.node.up`, and once more after a failure, whose lines are logged in full.

        A failed start removed what it started. The second start is for a machine's passing trouble
        (the suite starts the nodes while its other tests load both cores); scripts/test repeats the
        first failure's lines at the end of its output, so a start that needed two is seen.
        """
        from . import node

        try:
            node.up(self, log=log)
            return
        except node.NodeError as e:
            free = shutil.disk_usage(self.root).free / 2**30
            log(f"devcluster: the real nodes did not start ({free:.1f} GiB free), once more: {e}")
        try:
            node.up(self, log=log)
        except node.NodeError as e:
            raise ClusterError(f"the real nodes did not start, twice: {e}") from e

    def _wait(self, pred, what: str, timeout: float, proc: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if proc and not self.procs.alive(proc):
                raise ClusterError(f"{proc} exited while starting; its last lines:\n{self.procs.tail(proc)}")
            try:
                if pred():
                    return
            except (OSError, ValueError, subprocess.SubprocessError, ClusterError) as e:
                last = e
            time.sleep(0.3)
        log = self.procs.tail(proc or what)
        raise ClusterError(f"{what} was not ready within {timeout:.0f} s ({last}); its last lines:\n{log}")

    def _certs(self) -> None:
        ca = CA(self.pki)
        ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", "10.96.0.1"),
        )
        ca.issue("admin", "tfk8s-admin", org="system:masters", client=True)
        ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters", client=True
        )
        ca.issue("controller-manager", "system:kube-controller-manager", client=True)
        ca.issue("scheduler", "system:kube-scheduler", client=True)
        ca.issue("webhooks", "tfk8s-devcluster-webhooks", server=True, dns=("localhost",), ips=("127.0.0.1",))
        service_account_keys(self.pki)
        server = f"https://127.0.0.1:{self.state()['apiserver_port']}"
        _kubeconfig(self.kubeconfig, server, ca.crt, self.pki / "admin.crt", self.pki / "admin.key")
        for who in ("controller-manager", "scheduler"):
            _kubeconfig(
                self.root / f"{who}.kubeconfig",
                server,
                ca.crt,
                self.pki / f"{who}.crt",
                self.pki / f"{who}.key",
                user=who,
            )

    def _volumes(self, n: int) -> list[dict]:
        base = self.root / "volumes"
        for i in range(n):
            fresh_volume_dir(base / f"pv-{i:03d}")
        return [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"devcluster-pv-{i:03d}"},
                "spec": {
                    "storageClassName": "standard",
                    "capacity": {"storage": "100Gi"},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(base / f"pv-{i:03d}"), "type": "Directory"},
                },
            }
            for i in range(n)
        ]

    def _route_kwok_range(self, add: bool) -> None:
        # kwok gives pods addresses that no device holds; an unreachable route keeps any packet to
        # them on this machine (without it they would follow the default route out).
        if os.geteuid() != 0 or not shutil.which("ip"):
            return
        if not add and _other_kwok_running():
            # the route is the machine's: another cluster's kwok still invents addresses in the range,
            # and its API server dials them (pod logs) -- without the route that leaves by eth0
            return
        verb = "replace" if add else "del"
        subprocess.run(["ip", "route", verb, "unreachable", KWOK_POD_RANGE], capture_output=True)

    def _start_etcd(self, comp: build.Component) -> None:
        st = self.state()
        data = self.root / "etcd"
        data.mkdir(exist_ok=True, mode=0o700)
        self.procs.start(
            "etcd",
            [
                str(comp.path("etcd")),
                "--name",
                "devcluster",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                f"http://127.0.0.1:{st['etcd_port']}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{st['etcd_port']}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{st['etcd_peer_port']}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{st['etcd_peer_port']}",
                "--initial-cluster",
                f"devcluster=http://127.0.0.1:{st['etcd_peer_port']}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(8 * 2**30),
                "--log-level",
                "warn",
            ],
        )

    def apiserver_args(self) -> list[str]:
        """The API server's flags (also read by the tier-2 node, which adds its own)."""
        st, p = self.state(), self.pki
        return [
            "--etcd-servers",
            f"http://127.0.0.1:{st['etcd_port']}",
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--secure-port",
            str(st["apiserver_port"]),
            "--tls-cert-file",
            str(p / "apiserver.crt"),
            "--tls-private-key-file",
            str(p / "apiserver.key"),
            "--client-ca-file",
            str(p / "ca.crt"),
            "--kubelet-client-certificate",
            str(p / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key",
            str(p / "apiserver-kubelet-client.key"),
            "--service-account-issuer",
            "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file",
            str(p / "sa.pub"),
            "--service-account-signing-key-file",
            str(p / "sa.key"),
            "--service-cluster-ip-range",
            SERVICE_RANGE,
            "--authorization-mode",
            "Node,RBAC",
            # the defaults (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity,
            # ResourceQuota, Priority, ValidatingAdmissionPolicy, webhooks, ...) plus these
            "--enable-admission-plugins",
            "NodeRestriction,PodNodeSelector,PodTolerationRestriction",
            "--allow-privileged=true",
            # a loopback address may not be an Endpoints address: no reconciler for "kubernetes"
            "--endpoint-reconciler-type",
            "none",
            # the real node's name resolves nowhere: reach kubelets (logs, exec) by their address
            "--kubelet-preferred-address-types",
            "InternalIP,Hostname",
            "--profiling=false",
            # every request, who made it and its answer: the tests' record of what a client did
            "--audit-policy-file",
            str(self._audit_policy()),
            "--audit-log-path",
            str(self.audit_log),
            "--audit-log-format",
            "json",
            "--audit-log-maxsize",
            "0",
            "--audit-log-mode",
            "blocking",
        ]

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (one JSON event per request, at the Metadata level)."""
        return self.root / "audit.log"

    def _audit_policy(self) -> Path:
        p = self.root / "audit-policy.yaml"
        p.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived"],
                    "rules": [
                        # the control plane's own chatter is not what a test asks about
                        {
                            "level": "None",
                            "users": [
                                "system:kube-controller-manager",
                                "system:kube-scheduler",
                                "system:apiserver",
                            ],
                        },
                        {
                            "level": "None",
                            "userGroups": ["system:nodes"],
                            "verbs": ["get", "update", "patch"],
                            "resources": [
                                {"group": "", "resources": ["nodes", "nodes/status"]},
                                {"group": "coordination.k8s.io", "resources": ["leases"]},
                            ],
                        },
                        {"level": "Metadata"},
                    ],
                }
            )
        )
        return p

    def _start_apiserver(self, comp: build.Component) -> None:
        self.procs.start("kube-apiserver", [str(comp.path("kube-apiserver")), *self.apiserver_args()])

    def _start_controllers(self, comp: build.Component) -> None:
        p = self.pki
        cm = self.root / "controller-manager.kubeconfig"
        self.procs.start(
            "kube-controller-manager",
            [
                str(comp.path("kube-controller-manager")),
                "--kubeconfig",
                str(cm),
                "--authentication-kubeconfig",
                str(cm),
                "--authorization-kubeconfig",
                str(cm),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "0",
                "--leader-elect=false",
                "--use-service-account-credentials",
                "--service-account-private-key-file",
                str(p / "sa.key"),
                "--root-ca-file",
                str(p / "ca.crt"),
                "--service-cluster-ip-range",
                SERVICE_RANGE,
                "--cluster-signing-cert-file",
                str(p / "ca.crt"),
                "--cluster-signing-key-file",
                str(p / "ca.key"),
                "--profiling=false",
            ],
        )
        sch = self.root / "scheduler.kubeconfig"
        self.procs.start(
            "kube-scheduler",
            [
                str(comp.path("kube-scheduler")),
                "--kubeconfig",
                str(sch),
                "--authentication-kubeconfig",
                str(sch),
                "--authorization-kubeconfig",
                str(sch),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "0",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        # default ServiceAccounts appear once the controller manager runs
        self._wait(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0
            ),
            "kube-controller-manager",
            120,
            proc="kube-controller-manager",
        )

    # -- kwok --------------------------------------------------------------------------------
    def _kwok_stages(self, kwok_dir: Path) -> Path:
        stage = kwok_dir / "kustomize" / "stage"
        docs = []
        for rel in (
            "node/fast/node-initialize.yaml",
            "node/heartbeat/node-heartbeat.yaml",
            "pod/fast/pod-ready.yaml",
            "pod/general/pod-delete.yaml",  # waits for the Job controller's finalizer to go
        ):
            docs.append((stage / rel).read_text())
        docs.append(yaml.safe_dump(_exit_stage()))
        docs.append(yaml.safe_dump(_terminating_stage()))
        out = self.root / "kwok-stages.yaml"
        out.write_text("\n---\n".join(docs))
        return out

    def _start_kwok(self, comp: build.Component, nodes: int) -> None:
        kwok_dir = _module_dir("sigs.k8s.io/kwok", comp.version)
        stages = self._kwok_stages(kwok_dir)
        self.procs.start(
            "kwok",
            [
                str(comp.path("kwok")),
                "--kubeconfig",
                str(self.kubeconfig),
                "--config",
                str(stages),
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--cidr",
                KWOK_POD_RANGE,
                "--node-ip",
                "10.0.0.1",
            ],
        )
        self.apply([fake_node(f"kwok-node-{i}") for i in range(nodes)])
        self._wait(lambda: self._nodes_ready(nodes), "kwok nodes", 60, proc="kwok")

    def _nodes_ready(self, n: int) -> bool:
        out = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)
        ready = [
            node
            for node in out["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) >= n

    # -- JobSet and Kueue --------------------------------------------------------------------
    def _webhook_url(self, port: int, path: str) -> dict:
        ca = (self.pki / "ca.crt").read_bytes()
        import base64

        return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca).decode()}

    def _webhook_configs(self, manifests: Path, prefix: str, port: int, keep) -> list[dict]:
        objs = []
        for doc in yaml.safe_load_all(manifests.read_text()):
            if not doc:
                continue
            doc = copy.deepcopy(doc)
            doc["metadata"] = {"name": f"{prefix}-{doc['metadata']['name']}"}
            hooks = []
            for h in doc.get("webhooks", []):
                path = h["clientConfig"]["service"]["path"]
                if not keep(path):
                    continue
                h["clientConfig"] = self._webhook_url(port, path)
                hooks.append(h)
            doc["webhooks"] = hooks
            objs.append(doc)
        return objs

    def _certdir(self, name: str) -> Path:
        d = self.root / f"{name}-certs"
        d.mkdir(exist_ok=True, mode=0o700)
        for src, dst in (("webhooks.crt", "tls.crt"), ("webhooks.key", "tls.key")):
            shutil.copyfile(self.pki / src, d / dst)
        return d

    def _start_jobset(self, comp: build.Component, timeout: float) -> None:
        st = self.state()
        mod = _module_dir("sigs.k8s.io/jobset", comp.version)
        cfg = mod / "config" / "components"
        crd = yaml.safe_load((cfg / "crd/bases/jobset.x-k8s.io_jobsets.yaml").read_text())
        self.apply([crd])
        self._established([crd])
        hooks = self._webhook_configs(
            cfg / "webhook/manifests.yaml", "jobset", st["jobset_webhook_port"], lambda path: True
        )
        # the kustomize patches narrow JobSet's pod webhooks to JobSet's own pods
        for h in (h for obj in hooks for h in obj["webhooks"] if h["name"] in ("mpod.kb.io", "vpod.kb.io")):
            h["objectSelector"] = {
                "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
            }
        conf = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {
                "port": st["jobset_webhook_port"],
                "host": "127.0.0.1",
                "certDir": str(self._certdir("jobset")),
            },
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{st['jobset_health_port']}"},
        }
        self._run_controller(
            "jobset", comp, conf, ["--zap-log-level", "info"], hooks, _probe_jobset(), timeout
        )

    def _start_kueue(self, comp: build.Component, timeout: float) -> None:
        st = self.state()
        mod = _module_dir("sigs.k8s.io/kueue", comp.version)
        cfg = mod / "config" / "components"
        port = st["kueue_webhook_port"]
        crds = []
        converted = {
            p.name.removeprefix("webhook_in_").removesuffix(".yaml")
            for p in (cfg / "crd/patches").glob("webhook_in_*.yaml")
        }
        for f in sorted((cfg / "crd/bases").glob("*.yaml")):
            crd = yaml.safe_load(f.read_text())
            if crd["spec"]["names"]["plural"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": self._webhook_url(port, "/convert"),
                        "conversionReviewVersions": ["v1"],
                    },
                }
            crds.append(crd)
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}, *crds])
        self._established(crds)
        # only the integrations this lab uses: JobSet and Kueue's own objects (its pod, Deployment and
        # Job webhooks fail closed and would stand in front of every pod of the cluster)
        hooks = self._webhook_configs(
            cfg / "webhook/manifests.yaml",
            "kueue",
            port,
            lambda path: "kueue-x-k8s-io" in path or "jobset-x-k8s-io" in path,
        )
        metrics = Path("/etc/kueue/metrics/certs")  # a fixed path in Kueue when its own certs are off
        metrics.mkdir(parents=True, exist_ok=True)
        for src, dst in (("webhooks.crt", "tls.crt"), ("webhooks.key", "tls.key")):
            shutil.copyfile(self.pki / src, metrics / dst)
        conf = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(self._certdir("kueue"))},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{st['kueue_health_port']}"},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["jobset.x-k8s.io/jobset"]},
        }
        self._run_controller(
            "kueue",
            comp,
            conf,
            ["--feature-gates=VisibilityOnDemand=false"],
            hooks,
            _probe_resource_flavor(),
            timeout,
        )

    def _run_controller(
        self,
        name: str,
        comp: build.Component,
        conf: dict,
        args: list[str],
        hooks: list[dict],
        probe: dict,
        timeout: float,
    ) -> None:
        """Start a controller-runtime controller (JobSet, Kueue) with its config file, register its
        webhooks, and wait until a dry-run of ``probe`` has passed through them."""
        path = self.root / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(conf))
        self.procs.start(
            name,
            [str(comp.path(name)), "--config", str(path), *args],
            env={"KUBECONFIG": str(self.kubeconfig)},
        )
        self.apply(hooks)
        self._wait(lambda: self._webhook_roundtrip(probe), name, timeout, proc=name)

    def _established(self, crds: list[dict]) -> None:
        """Wait until the API server serves each CRD (a controller started earlier finds no kind)."""
        names = {c["metadata"]["name"] for c in crds}

        def established() -> bool:
            out = json.loads(self.kubectl("get", "crd", "-o", "json").stdout)
            ok = {
                c["metadata"]["name"]
                for c in out["items"]
                if any(
                    x["type"] == "Established" and x["status"] == "True"
                    for x in c.get("status", {}).get("conditions") or []
                )
            }
            return names <= ok

        self._wait(established, "the CRDs to be established", 60)

    def _webhook_roundtrip(self, obj: dict) -> bool:
        """A server-side dry-run create: it passes every webhook, so it proves they answer."""
        r = self.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False)
        if r.returncode:
            raise ClusterError(r.stderr.strip())
        return True

    # -- down --------------------------------------------------------------------------------
    def down(self, quiet: bool = False, keep_logs: bool = False) -> None:
        """Stop every process of the cluster (reverse start order) and remove its state."""
        from . import identity, ingress, node, storage

        names = self.procs.names()
        if "keeper" in names:
            self.procs.stop("keeper")  # first: it would start the others again
        # the Ingress controller (in the first node's namespace) and Dex (in the SSO host's, which
        # node.down removes with the nodes'), then the real nodes: their pods, mounts and network go
        # while the API server still answers
        ingress.down(self)
        identity.down(self)
        node.down(self, log=(lambda *_: None) if quiet else (lambda line: print(line, file=sys.stderr)))
        storage.down(self)  # the provisioner, the Gluster mount, its bricks and glusterd
        order = [n for n in reversed(CONTROL_PLANE_ORDER) if n in names] + [
            n for n in reversed(names) if n not in CONTROL_PLANE_ORDER
        ]
        for n in order:
            self.procs.stop(n)
        self._route_kwok_range(add=False)
        if self.root.exists():
            if keep_logs:
                for child in self.root.iterdir():
                    if child.name != "logs":
                        shutil.rmtree(child) if child.is_dir() else child.unlink()
            else:
                shutil.rmtree(self.root)
        if not quiet:
            print("devcluster: down", file=sys.stderr)


# The "standard" class: a pool of ReadWriteMany hostPath volumes made at start, bound to claims by
# the real PV controller. (The in-tree host-path provisioner offers ReadWriteOnce only, and the lab
# asks for ReadWriteMany.) Single-node semantics: every pod on this machine sees the same directory.
STORAGE_CLASS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
    "provisioner": "kubernetes.io/no-provisioner",
    "reclaimPolicy": "Retain",
    "volumeBindingMode": "Immediate",
}
PV_POOL = 400
#: the mode of every pool directory: a hostPath volume ignores the pod's fsGroup, and the lab's pods
#: run as non-root users (the hub as 1000:1000, notebooks as 1000:100), so the volume's root must
#: be writable by any uid, as a fresh NFS export for ReadWriteMany would be (sticky, like /tmp).
VOLUME_MODE = 0o1777


def fresh_volume_dir(path: Path) -> Path:
    """Make ``path`` an empty pool directory writable by a non-root pod (:data:`VOLUME_MODE`)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(VOLUME_MODE)  # explicit: mkdir's mode is masked by the umask
    return path


def _other_kwok_running() -> bool:
    """True while a kwok of any cluster directory runs on this machine (by its cached binary)."""
    kwok = str(build.COMPONENTS["kwok"].path("kwok"))
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "exe") == kwok:
                    return True
            except OSError:
                pass
    return False


def fake_node(name: str) -> dict:
    """A Node that kwok plays (annotated, tainted so that only pods that tolerate it land there)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": dict(KWOK_NODE_ANNOTATION),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "spec": {"taints": [dict(KWOK_TAINT)]},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    }


def _exit_stage() -> dict:
    """Our kwok Stage: a running pod labelled ``kwok.tfk8s.dev/exit=<code>`` ends with that code."""
    template = (
        "{{ $now := Now }}\n"
        f'{{{{ $code := index .metadata.labels "{EXIT_LABEL}" }}}}\n'
        "containerStatuses:\n"
        "{{ range $index, $item := .spec.containers }}\n"
        "- image: {{ $item.image | Quote }}\n"
        "  name: {{ $item.name | Quote }}\n"
        "  ready: false\n"
        "  restartCount: 0\n"
        "  started: false\n"
        "  state:\n"
        "    terminated:\n"
        "      exitCode: {{ $code }}\n"
        "      finishedAt: {{ $now | Quote }}\n"
        '      reason: {{ if eq $code "0" }}Completed{{ else }}Error{{ end }}\n'
        "      startedAt: {{ $now | Quote }}\n"
        "{{ end }}\n"
        '{{ if eq $code "0" }}phase: Succeeded{{ else }}phase: Failed{{ end }}\n'
    )
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "tfk8s-pod-exit"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                    {"key": f'.metadata.labels["{EXIT_LABEL}"]', "operator": "Exists"},
                ]
            },
            "next": {"statusTemplate": template},
        },
    }


def _terminating_stage() -> dict:
    """A running pod being deleted ends as a kubelet ends it: SIGTERM, exit 143, phase Failed.

    Only then does the Job controller remove its tracking finalizer and the pod go away (kwok's own
    "fast" delete stage removes pods at once, which a Job's finalizer forbids).
    """
    template = (
        "{{ $now := Now }}\n"
        "containerStatuses:\n"
        "{{ range $index, $item := .spec.containers }}\n"
        "- image: {{ $item.image | Quote }}\n"
        "  name: {{ $item.name | Quote }}\n"
        "  ready: false\n"
        "  restartCount: 0\n"
        "  started: false\n"
        "  state:\n"
        "    terminated:\n"
        "      exitCode: 143\n"
        "      finishedAt: {{ $now | Quote }}\n"
        "      reason: Error\n"
        "      startedAt: {{ $now | Quote }}\n"
        "{{ end }}\n"
        "phase: Failed\n"
    )
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "tfk8s-pod-terminating"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                    {"key": ".status.phase", "operator": "In", "values": ["Running", "Pending"]},
                ]
            },
            "next": {"statusTemplate": template},
        },
    }


def _probe_jobset() -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "w",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "c", "image": "probe"}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    }


def _probe_resource_flavor() -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "webhook-probe"},
    }
