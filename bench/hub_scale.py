"""The hub at scale on the REAL API server with kwok nodes: N users log in, spawn, and sit idle.

    scripts/kube up && .venv/bin/python bench/hub_scale.py --users 200 [--procs 4] [--rest 60]

The chart is installed (``helm install``; its hub and proxy pods land on kwok nodes and do
nothing) and its hub runs **as a process** of this machine with the chart's own
``jupyterhub_config.py`` and ``values.json`` (read back from the release's ConfigMap), acting with
the release's hub ServiceAccount token under the chart's RBAC and admission fence. The only
settings added (``hub.extraConfig``, the chart's own hook) make a process of it: loopback
addresses, a local configurable-http-proxy and sqlite file, the kwok placement of user
namespaces, and ``pod_connect_ip``: a kwok pod runs nothing, so the hub's "is the server up"
check is answered by a loopback stand-in of this bench (one HTTP 200 per server).

Then:

1. N users log in through the hub (the login form, then an API token) and start their server
   through the hub's REST API, at most the chart's ``hub.concurrentSpawnLimit`` default at once:
   KubeSpawner makes the namespace, the home claim and the notebook pod (on a kwok node), the
   chart's pre-spawn hook bootstraps the namespace. Spawn time: the POST to the progress
   stream's ``ready`` event.
2. Each notebook is then an idle ``KubernetesBackend`` acting as its user's ServiceAccount token
   (what the notebook pod mounts) that has launched one ``--tasks``-task cluster and watches it,
   in ``--procs`` processes.
3. At rest: watches and requests/min per notebook (the API server's audit log and
   ``apiserver_longrunning_requests``), and the hub's own requests.
4. One more user launches ``--clusters`` × ``--launch-tasks`` tasks → every pod Running, against
   ``kubectl apply`` of the same objects (:func:`k8s_scale.compare_launch`).

Printed: spawns ok/failed, spawn p50/p99, hub CPU and RSS, the API server's mutating and read
latencies by verb (``apiserver_request_duration_seconds`` over the whole run), the API server's and
etcd's CPU and RSS, and a last line summing up. Everything it makes is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "hub_config"), str(ROOT / "bench"), str(ROOT / "tests")]

from _common import MARK, free_ports, median, pct  # noqa: E402
from k8s_scale import compare_launch, proc_usage, watches  # noqa: E402

from devcluster.cluster import Cluster, fake_node  # noqa: E402
from tests.hubclient import Hub  # noqa: E402
from tests.realkube import KWOK_ANNOTATIONS, RealKube, wait_for  # noqa: E402

RELEASE = "lab"
HUB_SA = f"{RELEASE}-tfk8s-lab-hub"
MUTATING = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
READ = ("GET", "LIST")
PASSWORD = secrets.token_urlsafe(12)
#: The control plane's processes whose CPU and memory are printed.
PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")


# -- the API server's request latencies ------------------------------------------------------------
def request_buckets(c: Cluster) -> dict[str, dict[float, float]]:
    """``apiserver_request_duration_seconds`` cumulative buckets summed by verb (WATCH and CONNECT
    excluded, as the SLO does)."""
    _, body = c.get("/metrics", timeout=30)
    out: dict[str, dict[float, float]] = {}
    for line in body.decode().splitlines():
        if not line.startswith("apiserver_request_duration_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split('",'))
        verb = fields["verb"].strip('"')
        if verb in ("WATCH", "CONNECT"):
            continue
        le = fields["le"].strip('"')
        le_f = float("inf") if le == "+Inf" else float(le)
        out.setdefault(verb, {}).setdefault(le_f, 0.0)
        out[verb][le_f] += float(value)
    return out


def quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus' ``histogram_quantile`` of cumulative ``buckets`` (linear within a bucket)."""
    edges = sorted(buckets)
    total = buckets[edges[-1]] if edges else 0
    if not total:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-9)
        lower, below = le, buckets[le]
    return lower


def delta(after: dict, before: dict, verbs) -> dict[float, float]:
    """The buckets of ``verbs`` observed between two scrapes, summed."""
    out: dict[float, float] = {}
    for v in verbs:
        for le, n in after.get(v, {}).items():
            out[le] = out.get(le, 0.0) + n - before.get(v, {}).get(le, 0.0)
    return out


# -- the hub as a process with the chart's config ------------------------------------------------------
class StandIn(BaseHTTPRequestHandler):
    """What answers the hub's "is the server up" request for a kwok pod (which runs nothing)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        from jupyterhub import __version__

        self.send_response(200)
        self.send_header("X-JupyterHub-Version", __version__)  # what jupyterhub-singleuser sends
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def process_config(tmp: Path, ports: dict[str, int]) -> str:
    """``hub.extraConfig`` that runs the chart's hub as a process here (loopback only)."""
    chp = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
    return "\n".join(
        [
            f'c.JupyterHub.hub_bind_url = "http://127.0.0.1:{ports["hub"]}"',
            f'c.JupyterHub.hub_connect_url = "http://127.0.0.1:{ports["hub"]}"',
            f'c.JupyterHub.bind_url = "http://127.0.0.1:{ports["proxy"]}"',
            "c.ConfigurableHTTPProxy.should_start = True",
            f'c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{ports["proxy_api"]}"',
            f"c.ConfigurableHTTPProxy.command = [{str(chp)!r}]",
            f'c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"',
            f'c.JupyterHub.cookie_secret_file = "{tmp}/jupyterhub_cookie_secret"',
            f'c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"',
            # the culler as the chart runs it, pointed at where this hub listens
            "c.JupyterHub.services = [dict(s, command=[a.replace('http://127.0.0.1:8081', "
            f"'http://127.0.0.1:{ports['hub']}') for a in s['command']]) for s in c.JupyterHub.services]",
            # KubeSpawner formats these with the user's fields: the JSON's braces doubled
            "c.KubeSpawner.user_namespace_annotations = "
            f"{ {k: v.replace('{', '{{').replace('}', '}}') for k, v in KWOK_ANNOTATIONS.items()}!r}",
            'c.KubeSpawner.pod_connect_ip = "127.0.0.1"',
            f"c.KubeSpawner.port = {ports['standin']}",
        ]
    )


def install_chart(c: Cluster, kube: RealKube, hub_ns: str, tmp: Path, ports: dict[str, int]) -> Path:
    """``helm install`` of the chart into ``hub_ns`` (kwok-placed), values for this machine."""
    from test_helm import CHART, helm_binary

    class _Factory:  # helm_binary's pytest arguments, outside pytest: a cache dir of our own
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name, dir=tmp))

    class _Request:
        class config:  # noqa: N801
            cache = None

    helm = helm_binary(_Request(), _Factory())
    kube.core.create_namespace({"metadata": {"name": hub_ns, "annotations": dict(KWOK_ANNOTATIONS)}})
    values = {
        "hub": {"extraConfig": process_config(tmp, ports)},
        "auth": {"sharedPassword": PASSWORD},
        "lab": {"storage_class": "standard"},
    }
    (tmp / "values.json").write_text(json.dumps(values))
    subprocess.run(
        [str(helm), "install", RELEASE, str(CHART), "-n", hub_ns, "--kubeconfig", str(c.kubeconfig),
         "-f", str(tmp / "values.json"), "--wait=false"],
        capture_output=True, text=True, check=True, timeout=300,
    )
    return helm


def uninstall_chart(c: Cluster, hub_ns: str, helm: Path | None) -> None:
    if helm:  # --no-hooks: kwok runs no container, the uninstall hook's pod would never end
        subprocess.run([str(helm), "uninstall", RELEASE, "-n", hub_ns, "--kubeconfig", str(c.kubeconfig),
                        "--no-hooks"], capture_output=True, timeout=300)


def start_hub(c: Cluster, kube: RealKube, hub_ns: str, tmp: Path, ports: dict[str, int]) -> subprocess.Popen:
    """The chart's hub as a process: its ConfigMap's files, its ServiceAccount's token."""
    cm = next(
        m for m in kube.core.list_namespaced_config_map(hub_ns).items
        if "jupyterhub_config.py" in (m.data or {})
    )
    (tmp / "jupyterhub_config.py").write_text(cm.data["jupyterhub_config.py"])
    (tmp / "hub-values.json").write_text(cm.data["values.json"])
    token = kube.token(hub_ns, HUB_SA, seconds=6 * 3600)
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "hub",
        "clusters": [{"name": "c", "cluster": {"server": c.server,
                                               "certificate-authority": str(c.pki / "ca.crt")}}],
        "users": [{"name": "hub", "user": {"token": token}}],
        "contexts": [{"name": "hub", "context": {"cluster": "c", "user": "hub", "namespace": hub_ns}}],
    }
    (tmp / "hub.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    (tmp / "hub.kubeconfig").chmod(0o600)
    env = {
        **os.environ,
        "KUBECONFIG": str(tmp / "hub.kubeconfig"),
        "TFK8S_HUB_VALUES": str(tmp / "hub-values.json"),
        "POD_NAMESPACE": hub_ns,
        "TFK8S_SHARED_PASSWORD": PASSWORD,
        "CONFIGPROXY_AUTH_TOKEN": secrets.token_hex(16),
        "PYTHONPATH": str(ROOT / "hub_config"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    log = open(tmp / "hub.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(tmp / "jupyterhub_config.py")],
        cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{ports['proxy']}"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"the hub exited: {(tmp / 'hub.log').read_text()[-3000:]}")
        try:
            return requests.get(f"{url}/hub/api", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    wait_for(up, 120, interval=0.5, message="the hub")
    return proc


# -- users ------------------------------------------------------------------------------------------------
def spawn(url: str, hub: Hub, user: str, timeout: float) -> tuple[float, str]:
    """Start ``user``'s server through the REST API; ``(seconds to ready, "" or why not)``."""
    t0 = time.monotonic()
    while True:
        r = hub.api("POST", f"/hub/api/users/{user}/server")
        if r.status_code != 429:
            break
        time.sleep(float(r.headers.get("Retry-After", "1")))
    if r.status_code not in (201, 202):
        return time.monotonic() - t0, f"POST {r.status_code}: {r.text[:200]}"
    if r.status_code == 201:
        return time.monotonic() - t0, ""
    with requests.get(f"{url}/hub/api/users/{user}/server/progress", stream=True, timeout=timeout,
                      headers={"Authorization": f"token {hub.token}"}) as s:
        for line in s.iter_lines():
            if not line.startswith(b"data:"):
                continue
            ev = json.loads(line[5:])
            if ev.get("ready"):
                return time.monotonic() - t0, ""
            if ev.get("failed"):
                return time.monotonic() - t0, ev.get("message", "failed")
    return time.monotonic() - t0, "the progress stream ended without ready"


class Sampler:
    """Peak RSS of some processes, sampled every 2 s in a thread."""

    def __init__(self, pids: dict[str, int]):
        self.procs = {n: psutil.Process(p) for n, p in pids.items()}
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(2):
            for n, p in list(self.procs.items()):
                try:
                    rss = p.memory_info().rss + sum(ch.memory_info().rss for ch in p.children(True))
                except psutil.Error:
                    continue
                self.peak[n] = max(self.peak[n], rss)

    def add(self, name: str, pid: int) -> None:
        self.peak[name] = 0
        self.procs[name] = psutil.Process(pid)

    def stop(self):
        self._stop.set()
        self._t.join()


def cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (the hub: the proxy and the culler)."""
    p = psutil.Process(pid)
    total = sum(p.cpu_times()[:2])
    for ch in p.children(True):
        try:
            total += sum(ch.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


# -- notebooks: idle KubernetesBackends in a few processes ----------------------------------------------
def notebook_worker() -> int:
    """One process of notebooks: stdin gives ``{"users": [[namespace, user, token], ...], "tasks": T}``;
    each launches a T-task cluster and watches it until stdin closes."""
    from tfk8s_magics.backends.kubernetes import KubernetesBackend
    from tfk8s_magics.spec import ClusterSpec

    job = json.loads(sys.stdin.readline())
    c = Cluster()
    kube = RealKube(str(c.kubeconfig), None)
    backends = []
    for ns, user, token in job["users"]:
        be = KubernetesBackend(namespace=ns, api_client=kube.client_with_token(token), user=user,
                               storage_class="standard")
        be.launch(ClusterSpec(name="c0", ps=1, workers=job["tasks"] - 1, script="print(1)\n"))
        backends.append(be)
    print("launched", flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    for be in backends:
        be.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=4, help="tasks of each user's idle cluster (default 4)")
    ap.add_argument("--procs", type=int, default=4, help="processes the notebooks run in (default 4)")
    ap.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest (default 60)")
    ap.add_argument("--clusters", type=int, default=5, help="clusters of the launch comparison")
    ap.add_argument("--launch-tasks", type=int, default=8, help="tasks of each compared cluster")
    ap.add_argument("--launch-rounds", type=int, default=3, help="rounds of the comparison (median)")
    ap.add_argument("--notebook-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.notebook_worker:
        return notebook_worker()
    from jupyterhub.app import JupyterHub

    from tfk8s_magics.spec import ClusterSpec

    c = Cluster()
    if not c.running():
        print("no devcluster runs: scripts/kube up", file=sys.stderr)
        return 2
    kube = RealKube(str(c.kubeconfig), c.audit_log)
    chart = yaml.safe_load((ROOT / "helm" / "tfk8s-lab" / "values.yaml").read_text())
    limit = chart["hub"].get("concurrentSpawnLimit")
    if limit is None:  # a chart without the value: JupyterHub's own default
        limit = JupyterHub.concurrent_spawn_limit.default_value
    n = a.users
    hub_ns = f"hs{secrets.token_hex(2)}"
    users = [f"u{i:04d}" for i in range(n)]
    pods = n * (1 + a.tasks) + 2 * a.launch_rounds * a.clusters * a.launch_tasks
    claims = n * 3 + 4 * a.launch_rounds * a.clusters + 10  # a home each, /data and /log of each cluster
    # room for every pod by count (110 a kwok node) and by CPU requests (32 a kwok node): a notebook's
    # guarantee and each task's default request, as the chart's settings give them
    from tfk8s_hub.settings import LabSettings

    lab = LabSettings()
    cpu = n * (cpu_cores(lab.notebook_cpu_guarantee) + a.tasks * cpu_cores(lab.default_requests["cpu"]))
    cpu += 2 * a.launch_rounds * a.clusters * a.launch_tasks * cpu_cores(lab.default_requests["cpu"])
    nodes = [fake_node(f"kwok-hs-{i}") for i in range(max(pods // 100, int(cpu / 30)) + 2)]
    pvs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"hs-pv-{i:05d}"},
         "spec": {"storageClassName": "standard", "capacity": {"storage": "100Gi"},
                  "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Delete",
                  "hostPath": {"path": "/nonexistent-kwok-only", "type": ""}}}
        for i in range(claims)
    ]
    tmp = Path(tempfile.mkdtemp(prefix="hub-scale-"))
    ports = dict(zip(("hub", "proxy", "proxy_api", "standin"), free_ports(4), strict=True))
    standin = ThreadingHTTPServer(("127.0.0.1", ports["standin"]), StandIn)
    threading.Thread(target=standin.serve_forever, daemon=True).start()
    hub = helm = None
    workers: list[subprocess.Popen] = []
    backends = []
    try:
        c.apply(nodes)
        for i in range(0, len(pvs), 200):
            c.apply(pvs[i : i + 200])
        wait_for(lambda: c._nodes_ready(len(nodes)), 180, message="bench nodes")
        helm = install_chart(c, kube, hub_ns, tmp, ports)
        hub = start_hub(c, kube, hub_ns, tmp, ports)
        url = f"http://127.0.0.1:{ports['proxy']}"
        pids = {"hub": hub.pid, **{x: json.loads((c.procs.pids / f"{x}.json").read_text())["pid"]
                                   for x in PLANE}}
        sampler = Sampler(pids)
        metrics0 = request_buckets(c)

        def cpu_now() -> dict[str, float]:
            return {"hub": cpu_s(hub.pid), **{x: proc_usage(c, x)[0] for x in PLANE}}

        cpu0 = cpu_now()
        base_watches = watches(c)

        # -- 1. logins, then spawns at the hub's concurrency ------------------------------------------
        t0 = time.monotonic()
        sessions: dict[str, Hub] = {}

        def login(u):
            h = Hub(url, note="hub_scale")
            r = h.login(u, PASSWORD)
            if r.status_code != 302:
                raise AssertionError(f"login of {u}: {r.status_code} {r.text[:300]}")
            sessions[u] = h

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(login, users))
        t_login = time.monotonic() - t0
        t0 = time.monotonic()
        with ThreadPoolExecutor(limit) as ex:
            results = dict(zip(users, ex.map(lambda u: spawn(url, sessions[u], u, 600), users), strict=True))
        t_spawn = time.monotonic() - t0
        cpu_spawn = {"hub": cpu_s(hub.pid) - cpu0["hub"]}
        ok = [u for u, (_, err) in results.items() if not err]
        failed = {u: err for u, (_, err) in results.items() if err}
        times = [t for t, err in results.values() if not err]
        stages = pod_stages(kube, hub_ns)

        # -- 2. the notebooks: an idle backend per user, as its ServiceAccount -----------------------
        sa = lab.service_account
        namespaces = {u: f"{hub_ns}-{u}" for u in ok}
        jobs = [[namespaces[u], u, kube.token(namespaces[u], sa, seconds=6 * 3600)] for u in ok]
        t0 = time.monotonic()
        for k in range(a.procs):
            part = jobs[k :: a.procs]
            if not part:
                continue
            w = subprocess.Popen([sys.executable, __file__, "--notebook-worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, start_new_session=True,
                                 env={**os.environ, "TFK8S_KUBE_DIR": str(c.root)})
            w.stdin.write(json.dumps({"users": part, "tasks": a.tasks}) + "\n")
            w.stdin.flush()
            workers.append(w)
            sampler.add(f"notebooks-{k}", w.pid)
        for w in workers:
            if w.stdout.readline().strip() != "launched":
                raise AssertionError("a notebook process failed while launching (its stderr above)")
        want = len(ok) * (1 + a.tasks)
        wait_for(
            lambda: sum(1 for p in kube.core.list_pod_for_all_namespaces(
                field_selector="status.phase=Running").items
                if p.metadata.namespace.startswith(f"{hub_ns}-")) >= want,
            1800, interval=3, message=f"{want} pods running in the users' namespaces",
        )
        t_clusters = time.monotonic() - t0
        time.sleep(5)

        # -- 3. at rest ------------------------------------------------------------------------------
        off = kube.audit_size()
        w_rest = watches(c) - base_watches
        cpu_r0 = cpu_now()
        time.sleep(a.rest)
        cpu_rest = cpu_now()
        rest = kube.audit(off)
        names = {f"system:serviceaccount:{ns}:{sa}" for ns in namespaces.values()}
        nb_reqs = [r for r in rest if r.user in names]
        hub_reqs = [r for r in rest if r.user == f"system:serviceaccount:{hub_ns}:{HUB_SA}"]

        # -- 4. one more user launches while N are idle -----------------------------------------------
        specs = [ClusterSpec(name=f"c{k}", ps=1, workers=a.launch_tasks - 1, script="print(1)\n")
                 for k in range(a.clusters)]
        rounds = []  # (ours, kubectl), each round in fresh namespaces: the machine is shared
        for _ in range(a.launch_rounds):
            launch = compare_launch(c, kube, specs)
            if launch is None:
                return 1
            be, _, _, t_ours, t_kubectl, _ = launch
            backends.append(be)
            rounds.append((t_ours, t_kubectl))
        ratio = median([o / k for o, k in rounds])
        t_ours, t_kubectl = median([o for o, _ in rounds]), median([k for _, k in rounds])
        metrics1 = request_buckets(c)
        cpu1 = cpu_now()
        sampler.stop()
        rss = sampler.peak

        # -- printed -----------------------------------------------------------------------------------
        print(f"users {n}: {len(ok)} ok, {len(failed)} failed; {pods} pods on {len(nodes) + 2} kwok nodes; "
              f"load {' '.join(f'{x:.1f}' for x in psutil.getloadavg())}")
        for u, err in list(failed.items())[:5]:
            print(f"  failed {u}: {err}")
        if failed:  # the hub's reasons (a spawn's 500 says nothing more)
            said = {line.split("server: ", 1)[-1] for line in (tmp / "hub.log").read_text().splitlines()
                    if "Unhandled error starting" in line or "Failed to start" in line}
            for reason in sorted(said)[:5]:
                print(f"  the hub: {reason[:300]}")
        print(f"logins {t_login:.0f} s; spawns at concurrency {limit} (the chart's concurrentSpawnLimit "
              f"default): all in {t_spawn:.0f} s, spawn p50 {pct(times, 50):.1f} s, "
              f"p99 {pct(times, 99):.1f} s, max {max(times, default=float('nan')):.1f} s")
        print("notebook pods, from creation: " + "; ".join(
            f"{k} p50 {pct(v, 50):.0f} s p99 {pct(v, 99):.0f} s" for k, v in stages.items()))
        print(f"hub (with its proxy and culler): {cpu_spawn['hub']:.0f} CPU s for the spawns, "
              f"{(cpu_rest['hub'] - cpu_r0['hub']) / a.rest * 100:.1f} % of a core at rest, "
              f"peak RSS {rss['hub'] / 2**20:.0f} MiB")
        print(f"notebooks: {len(ok)} clusters of {a.tasks} tasks launched by {len(workers)} processes, "
              f"all running after {t_clusters:.0f} s; peak RSS of a process "
              f"{max((v for n, v in rss.items() if n.startswith('notebooks-')), default=0) / 2**20:.0f} MiB "
              f"({len(ok) / max(len(workers), 1):.0f} notebooks each)")
        print(f"at rest ({a.rest:.0f} s): {w_rest / max(len(ok), 1):.2f} watches and "
              f"{len(nb_reqs) / max(len(ok), 1) / (a.rest / 60):.2f} requests/min per notebook "
              f"(verbs {sorted({r.verb for r in nb_reqs})}); the hub {len(hub_reqs) / (a.rest / 60):.1f} "
              f"requests/min (verbs {sorted({r.verb for r in hub_reqs})})")
        lat = {}
        for verb in (*MUTATING, *READ):
            d = delta(metrics1, metrics0, (verb,))
            count = max(d.values(), default=0)
            if count:
                lat[verb] = (count, quantile(d, 0.5), quantile(d, 0.99))
        print("API server request latency over the run (apiserver_request_duration_seconds), by verb: "
              + "; ".join(f"{v} n={int(x[0])} p50 {x[1] * 1000:.0f} ms p99 {x[2] * 1000:.0f} ms"
                          for v, x in lat.items()))
        mut, rd = delta(metrics1, metrics0, MUTATING), delta(metrics1, metrics0, READ)
        print(f"API mutating p50 {quantile(mut, 0.5) * 1000:.0f} ms p99 {quantile(mut, 0.99) * 1000:.0f} ms; "
              f"read p50 {quantile(rd, 0.5) * 1000:.0f} ms p99 {quantile(rd, 0.99) * 1000:.0f} ms "
              "(SLO: p99 <= 1 s each)")
        print("; ".join(
            f"{x} {cpu1[x] - cpu0[x]:.0f} CPU s ({(cpu_rest[x] - cpu_r0[x]) / a.rest * 100:.1f} % of a core "
            f"at rest), peak RSS {rss[x] / 2**20:.0f} MiB" for x in PLANE))
        print(f"launch -> all {a.clusters * a.launch_tasks} pods Running, one more user while {len(ok)} are "
              f"idle, median of {len(rounds)} rounds: ours {t_ours:.1f} s, kubectl apply {t_kubectl:.1f} s, "
              f"ratio {ratio:.2f} (rounds: {', '.join(f'{o:.1f}/{k:.1f}' for o, k in rounds)})")
        print(f"{n} users: {len(ok)} ok, spawn p99 {pct(times, 99):.1f} s, "
              f"API mutating p99 {quantile(mut, 0.99):.2f} s, read p99 {quantile(rd, 0.99):.2f} s, "
              f"launch {ratio:.2f} × kubectl")
    finally:
        for w in workers:
            try:
                w.stdin.close()
                w.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(w.pid, 9)
        for be in backends:
            be.close()
        if hub is not None:
            os.killpg(hub.pid, 15)
            try:
                hub.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(hub.pid, 9)
        standin.shutdown()
        kube.cleanup()
        uninstall_chart(c, hub_ns, helm)
        gone = delete_namespaces(kube, [hub_ns, *(f"{hub_ns}-{u}" for u in users)])
        for node in nodes:
            c.kubectl("delete", "node", node["metadata"]["name"], "--wait=false", check=False)
        delete_pvs(c, [p["metadata"]["name"] for p in pvs])
        print(f"teardown: the namespaces gone after {gone():.0f} s", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)  # the hub's files and log, helm's cache
    return 0


def cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity in cores ("250m" -> 0.25)."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def pod_stages(kube: RealKube, hub_ns: str) -> dict[str, list[float]]:
    """Seconds from each notebook pod's creation to its PodScheduled and Ready conditions
    (the API's timestamps: whole seconds)."""
    out: dict[str, list[float]] = {"scheduled": [], "ready": []}
    for p in kube.core.list_pod_for_all_namespaces(label_selector="component=singleuser-server").items:
        if not p.metadata.namespace.startswith(f"{hub_ns}-"):
            continue
        for cond in p.status.conditions or []:
            key = {"PodScheduled": "scheduled", "Ready": "ready"}.get(cond.type)
            if key and cond.status == "True":
                out[key].append((cond.last_transition_time - p.metadata.creation_timestamp).total_seconds())
    return out


def delete_namespaces(kube: RealKube, names: list[str]):
    """Delete ``names``; returns a wait for them to be gone (so the next run starts on a quiet
    API server) that gives the seconds it took."""
    from kubernetes.client.rest import ApiException

    t0 = time.monotonic()
    for ns in names:
        try:
            kube.core.delete_namespace(ns, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise
    mine = set(names)

    def gone() -> float:
        wait_for(lambda: not mine & {n.metadata.name for n in kube.core.list_namespace().items},
                 1800, interval=5, message="the bench's namespaces to go")
        return time.monotonic() - t0

    return gone


def delete_pvs(c: Cluster, names: list[str]) -> None:
    for i in range(0, len(names), 200):
        c.kubectl("delete", "pv", "--wait=false", "--ignore-not-found", *names[i : i + 200], check=False)


if __name__ == "__main__":
    os.environ.setdefault("TFK8S_BENCH_RUN", MARK)  # every process this bench starts carries it
    sys.exit(main())
