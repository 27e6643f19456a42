"""Run rendered pods as podman containers for one test run, and leave nothing behind (a TEST HARNESS).

Everything a :class:`PodmanRun` creates — one network, the podman volumes
standing for the claims, the containers, the ConfigMap files — carries the
run's unique prefix, and :meth:`PodmanRun.cleanup` removes all of it
(called from a fixture's ``finally``, so also after a failure).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from .pods import ContainerPlan, Manifest, container_plan, pod_instances

REPO = Path(__file__).resolve().parents[2]


def _build_images_module():
    spec = importlib.util.spec_from_file_location("build_images", REPO / "scripts" / "build_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_images = _build_images_module()


class InitFailed(Exception):
    """An init container exited non-zero: the pod failed before its app container started."""

    def __init__(self, container: str, code: int, logs: str) -> None:
        super().__init__(f"init container {container} exited {code}: {logs.strip()[-500:]}")
        self.container, self.code, self.logs = container, code, logs


class PodmanRun:
    """The containers, volumes and network of one test, all named ``<prefix>-…``."""

    def __init__(self, prefix: str, workdir: Path) -> None:
        self.prefix = prefix
        self.workdir = workdir
        self.podman = build_images.podman_base()
        self.network = f"{prefix}-net"
        self._network_made = False
        self.volumes: dict[str, str] = {}
        # pods start from several threads (the podman kubelet): create shared things once
        self._lock = threading.Lock()

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """``podman ARGS`` (no shell), output captured as text."""
        r = subprocess.run([*self.podman, *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])} failed ({r.returncode}): {r.stderr[-2000:]}")
        return r

    def ensure_network(self) -> str:
        """The run's network (its DNS resolves the aliases of the containers on it)."""
        with self._lock:
            if not self._network_made:
                self._create_network()
        return self.network

    def _create_network(self) -> None:
        if not self._network_made:
            self.run("network", "create", "--label", f"tfk8s.test-run={self.prefix}", self.network)
            self._network_made = True

    def volume(self, claim: str, fs_group: int | None) -> str:
        """The podman volume standing for ``claim``; with ``fs_group``, owned as the kubelet
        leaves a volume for a pod with ``fsGroup``: group-owned, group-writable, setgid."""
        with self._lock:
            return self._volume(claim, fs_group)

    def _volume(self, claim: str, fs_group: int | None) -> str:
        if claim not in self.volumes:
            name = f"{self.prefix}-{claim}"
            self.run("volume", "create", "--label", f"tfk8s.test-run={self.prefix}", name)
            self.volumes[claim] = name
            mountpoint = self.run("volume", "inspect", "--format", "{{.Mountpoint}}", name).stdout.strip()
            if fs_group is not None:
                os.chown(mountpoint, 0, fs_group)
                os.chmod(mountpoint, 0o2775)
        return self.volumes[claim]

    def image_user(self, image: str) -> str:
        """The image's USER (``uid[:gid]`` or a name; empty means root)."""
        return self.run("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()

    def plans(self, objects: list[Manifest], **options) -> list[ContainerPlan]:
        """A plan per pod of the rendered ``objects`` (raises :class:`~.pods.Unmappable`)."""
        network = self.ensure_network()
        return [container_plan(p, objects, prefix=self.prefix, network=network,
                               image_user=self.image_user(p.spec["containers"][0]["image"]), **options)
                for p in pod_instances(objects)]

    def start(self, plan: ContainerPlan, extra: list[str] = (), init_timeout: float = 600) -> str:
        """Create what ``plan`` mounts, run its init containers to their end (in order), then
        start its container (detached); the container's name.  An init container that exits
        non-zero raises :class:`InitFailed` and the app container never starts (as with
        ``restartPolicy: Never``: the pod fails)."""
        for init in plan.init:
            self._start(init, extra)
            code = self.wait_exit(init.container, timeout=init_timeout)
            if code != 0:
                raise InitFailed(init.container, code, self.logs(init.container))
        return self._start(plan, extra)

    def _start(self, plan: ContainerPlan, extra: list[str] = ()) -> str:
        args: list[str] = []
        it = iter(plan.run_args)
        for a in it:
            if a == "-v":
                target = next(it)
                if target.startswith("@claim:"):
                    _, claim, rest = target.split(":", 2)
                    target = f"{self.volume(claim, plan.fs_group)}:{rest}"
                elif target.startswith("@files:"):
                    _, rel, rest = target.split(":", 2)
                    rel, _, sub = rel.partition("/")  # a subPath: one file of the volume
                    source = self._write_files(rel, plan)
                    target = f"{source / sub if sub else source}:{rest}"
                args += ["-v", target]
            else:
                args.append(a)
        image_at = len(args) - (len(plan.run_args) - plan.run_args.index(plan.image))
        args[image_at:image_at] = [*build_images.run_flags(), *extra]
        self.run("run", "--detach", *args)
        return plan.container

    def _write_files(self, rel: str, plan: ContainerPlan) -> Path:
        d = self.workdir / rel
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        for name, (text, mode) in plan.config_files[rel].items():
            f = d / name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
            os.chmod(f, mode)
            if plan.fs_group is not None:
                os.chown(f, 0, plan.fs_group)
        return d

    def state(self, name: str) -> tuple[str, int]:
        """(status, exit code) of a container."""
        out = self.run("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout.split()
        return out[0], int(out[1])

    def wait_ready(self, plan: ContainerPlan, timeout: float = 180) -> float:
        """Run the pod's readiness probe (``podman exec``) until it passes; seconds it took."""
        start = time.monotonic()
        while True:
            status, code = self.state(plan.container)
            if status != "running":
                raise AssertionError(f"{plan.container} is {status} (exit {code}) before it was ready:\n"
                                     + self.logs(plan.container))
            if self.run("exec", plan.container, *plan.readiness, check=False).returncode == 0:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{plan.container} not ready after {timeout:g} s:\n"
                                     + self.logs(plan.container))
            time.sleep(0.5)

    def wait_exit(self, name: str, timeout: float = 300) -> int:
        """Block until the container exits; its exit code (as the runtime reports it)."""
        r = self.run("wait", name, timeout=timeout)
        return int(r.stdout.strip().splitlines()[-1])

    def logs(self, name: str) -> str:
        """The container's output (stdout and stderr)."""
        r = self.run("logs", name, check=False)
        return r.stdout + r.stderr

    def kill(self, name: str, signal: str) -> None:
        """Send ``signal`` to the container's PID 1 (what the kubelet does at a stop)."""
        self.run("kill", "--signal", signal, name)

    def leftovers(self) -> list[str]:
        """Whatever of this run still exists in podman (must be empty after cleanup)."""
        label = f"label=tfk8s.test-run={self.prefix}"
        out = self.run("ps", "-a", "--filter", label, "--format", "{{.Names}}").stdout.split()
        out += self.run("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split()
        nets = self.run("network", "ls", "--format", "{{.Name}}").stdout.split()
        return out + [n for n in nets if n.startswith(self.prefix)]

    def cleanup(self) -> None:
        """Remove every container, volume and file of this run, and its network."""
        label = f"label=tfk8s.test-run={self.prefix}"
        ids = self.run("ps", "-a", "-q", "--filter", label, check=False).stdout.split()
        if ids:
            self.run("rm", "--force", "--time", "0", *ids, check=False)
        for vol in self.run("volume", "ls", "-q", "--filter", label, check=False).stdout.split():
            self.run("volume", "rm", "--force", vol, check=False)
        if self._network_made:
            self.run("network", "rm", "--force", self.network, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)
