"""``%tfcluster`` / ``%%tfcluster``: thin magics over :mod:`tfk8s_magics.api`.

Each subcommand parses its arguments (no shell: ``shlex`` only) and makes
one call of the public API.  Usage mistakes raise ``UsageError`` with one
sentence; the defaults are traitlets an administrator sets for everyone
(``c.TFClusterMagics.default_workers = 2`` in an IPython config file).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display
from traitlets import Bool, Float, Int, Unicode, default, validate

from . import api, settings
from .errors import ClusterExists, ClusterNotFound, SpecError, TaskNotFound
from .spec import normalize_mode

SUBCOMMANDS = (
    "launch", "connect", "list", "status", "logs", "wait", "tensorboard", "stop", "delete",
    "render", "events", "dashboard",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as one UsageError sentence instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}. See %tfcluster --help.")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            raise UsageError(message.strip())
        raise _HelpShown()


class _HelpShown(Exception):
    pass


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env {text!r} is not KEY=VALUE")
    return key, value


@magics_class
class TFClusterMagics(Magics):
    """The ``%tfcluster`` magics.  Every trait below is a default an admin can set."""

    default_backend = Unicode(
        help="Backend used when --backend is not given: 'local' (processes on 127.0.0.1) or "
        "'kubernetes'. Default: $TFK8S_BACKEND, else 'kubernetes' inside a pod with a service "
        "account, else 'local'."
    ).tag(config=True)
    default_mode = Unicode("between", help="Mode used when --mode is not given.").tag(config=True)
    default_workers = Int(2, help="Workers per cluster when --workers is not given.").tag(config=True)
    default_ps = Int(1, help="Parameter servers per cluster when --ps is not given.").tag(config=True)
    ps_grace_period = Float(
        help="Seconds parameter servers live on after the workers finish (0 stops them at once)."
    ).tag(config=True)
    restart_budget = Int(help="Restarts a cluster may spend on crashed tasks before it fails.").tag(
        config=True
    )
    legacy_keras = Bool(
        help="Run tasks and the in-graph client with tf-keras (TF_USE_LEGACY_KERAS=1), which "
        "TensorFlow's distributed tutorials need under TF 2.21."
    ).tag(config=True)
    follow_logs = Bool(True, help="Stream a cluster's logs under its launch cell.").tag(config=True)
    log_lines = Int(
        500, help="Most log lines a live log view holds in the notebook (the files keep all)."
    ).tag(config=True)
    ready_timeout = Float(
        300.0, help="Seconds `launch --mode in-graph` and `connect` wait for the servers to be ready."
    ).tag(config=True)

    @default("default_backend")
    def _default_backend(self) -> str:
        return settings.default_backend()

    @default("ps_grace_period")
    def _default_grace(self) -> float:
        return settings.default_ps_grace()

    @default("restart_budget")
    def _default_restarts(self) -> int:
        return settings.default_restart_budget()

    @default("legacy_keras")
    def _default_legacy(self) -> bool:
        return settings.default_legacy_keras()

    @validate("default_mode")
    def _validate_mode(self, proposal: Any) -> str:
        return normalize_mode(proposal["value"])

    @validate("default_workers", "default_ps", "restart_budget", "log_lines")
    def _validate_count(self, proposal: Any) -> int:
        if proposal["value"] < 0:
            raise ValueError(f"{proposal['trait'].name} must be ≥ 0, got {proposal['value']}")
        return proposal["value"]

    # -- parsing -----------------------------------------------------------
    def _parser(self) -> _Parser:
        p = _Parser(prog="%tfcluster", add_help=True, description="Launch and manage TensorFlow clusters.")
        sub = p.add_subparsers(dest="cmd", metavar="SUBCOMMAND", parser_class=_Parser)

        def with_backend(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
            sp.add_argument("--backend", help="backend (default: %(default)s)", default=self.default_backend)
            return sp

        def spec_args(sp: argparse.ArgumentParser) -> None:
            sp.add_argument("name", help="cluster name (a DNS-1123 label, e.g. mnist)")
            sp.add_argument("--mode", default=self.default_mode, help="between | in-graph")
            sp.add_argument("--workers", type=str, default=str(self.default_workers))
            sp.add_argument("--ps", type=str, default=str(self.default_ps))
            sp.add_argument("--chief", type=str, default="0")
            sp.add_argument("--evaluator", type=str, default="0")
            sp.add_argument("--script", help="path of the training script (instead of the cell body)")
            sp.add_argument("--env", action="append", type=_env_pair, default=[], metavar="KEY=VALUE")
            sp.add_argument("--restarts", type=str, default=str(self.restart_budget),
                            help="restart budget for crashed tasks")
            sp.add_argument("--ps-grace", type=str, default=str(self.ps_grace_period),
                            help="seconds parameter servers live after the workers finish")
            sp.add_argument("--log-dir", help="log dir (TensorBoard, checkpoints, task logs)")
            sp.add_argument("--data-dir", help="data dir")
            sp.add_argument("--log-claim", help="existing PVC for /log (kubernetes)")
            sp.add_argument("--data-claim", help="existing PVC for /data (kubernetes)")
            sp.add_argument("--image", help="task image (kubernetes)")
            sp.add_argument("--cpu", help="CPU per task, e.g. 2 or 500m (kubernetes)")
            sp.add_argument("--memory", help="memory per task, e.g. 4Gi (kubernetes)")
            sp.add_argument("--gpus", type=str, default="0", help="GPUs per task (kubernetes)")
            sp.add_argument("--no-legacy-keras", action="store_true",
                            help="use Keras 3 instead of tf-keras in the tasks")
            with_backend(sp)

        launch = sub.add_parser("launch", help="launch a cluster (cell body = training script)")
        spec_args(launch)
        launch.add_argument("--detach", action="store_true", help="keep running after this kernel exits")
        launch.add_argument("--no-follow", action="store_true", help="don't stream logs under the cell")

        render = sub.add_parser("render", help="print the Kubernetes YAML without applying it")
        spec_args(render)
        render.set_defaults(backend="kubernetes")
        render.add_argument("--output-dir", help="write one YAML file per object here")
        render.add_argument("--tensorboard", action="store_true", help="include a TensorBoard Deployment")

        for name, helptext in (
            ("connect", "make this kernel the client of an in-graph cluster"),
            ("status", "show a cluster's tasks and progress"),
            ("wait", "wait until a cluster ends"),
            ("tensorboard", "start or reuse TensorBoard on a cluster's log dir"),
            ("stop", "stop a cluster's tasks (logs are kept)"),
            ("delete", "delete a cluster and what it created"),
            ("events", "show what happened to a cluster"),
            ("dashboard", "show a live dashboard of a cluster"),
        ):
            sp = with_backend(sub.add_parser(name, help=helptext))
            sp.add_argument("name")
            if name in ("connect", "wait"):
                sp.add_argument("--timeout", type=float, default=None)
            if name == "delete":
                sp.add_argument("--keep-logs", action="store_true", help="keep the log dir")
        logs = with_backend(sub.add_parser("logs", help="show a cluster's logs"))
        logs.add_argument("name")
        logs.add_argument("task", nargs="?", help="one task, e.g. worker-1 (default: all)")
        logs.add_argument("--tail", type=int, default=None, help="only the last N lines (per task)")
        logs.add_argument("--follow", "-f", action="store_true", help="keep streaming new lines")
        with_backend(sub.add_parser("list", help="list clusters"))
        return p

    def _parse(self, line: str) -> argparse.Namespace | None:
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%tfcluster: cannot parse {line!r}: {e}; check the quotes.") from None
        if not argv:
            raise UsageError(f"%tfcluster needs a subcommand: one of {', '.join(SUBCOMMANDS)}.")
        if argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
            raise UsageError(
                f"unknown subcommand {argv[0]!r}: use one of {', '.join(SUBCOMMANDS)} (%tfcluster --help)."
            )
        try:
            return self._parser().parse_args(argv)
        except _HelpShown:
            return None

    # -- the magic -----------------------------------------------------------
    @line_cell_magic
    def tfcluster(self, line: str, cell: str | None = None) -> Any:
        """Launch and manage distributed TensorFlow clusters.  ``%tfcluster --help`` lists subcommands."""
        if line.strip() in ("--help", "-h", "help"):
            self._parser().print_help()
            return None
        args = self._parse(line)
        if args is None:
            return None
        if cell is not None and args.cmd not in ("launch", "render") and cell.strip():
            raise UsageError(
                f"%%tfcluster {args.cmd} takes no cell body; only `launch` and `render` do (the script)."
            )
        try:
            return getattr(self, f"_cmd_{args.cmd}")(args, cell)
        except (SpecError, ClusterExists, ClusterNotFound, TaskNotFound) as e:
            raise UsageError(str(e)) from None

    # -- subcommands ---------------------------------------------------------
    def _spec(self, args: argparse.Namespace, cell: str | None):
        script = cell if cell is not None and cell.strip() else None
        return api.make_spec(
            args.name,
            mode=args.mode,
            workers=args.workers,
            ps=args.ps,
            chief=args.chief,
            evaluator=args.evaluator,
            script=script,
            script_path=args.script,
            env=dict(args.env),
            cpu=args.cpu,
            memory=args.memory,
            gpus=_int(args.gpus, "--gpus"),
            restart_budget=args.restarts,
            ps_grace_period=args.ps_grace,
            legacy_keras=False if args.no_legacy_keras else self.legacy_keras,
            image=args.image,
            log_dir=args.log_dir,
            data_dir=args.data_dir,
            log_claim=args.log_claim,
            data_claim=args.data_claim,
        )

    def _cmd_launch(self, args, cell):
        spec = self._spec(args, cell)
        cluster = api.launch(spec, backend_name=args.backend, detach=args.detach)
        if self.follow_logs and not args.no_follow:
            from .ui.logview import LogView, widgets_available

            if widgets_available():
                from .ui import dashboard

                dashboard.show(cluster, max_lines=self.log_lines)
            else:
                LogView(cluster.backend, cluster.name, max_lines=self.log_lines).show()
        if spec.mode == "in-graph":
            cluster.wait_ready(self.ready_timeout)
            print(f"{spec.name}: every server is ready; `strategy = %tfcluster connect {spec.name}` "
                  "makes this kernel the client.")
        return None

    def _cmd_render(self, args, cell):
        spec = self._spec(args, cell)
        objects = api.render_objects(spec, args.backend, tensorboard=args.tensorboard)
        import yaml

        if args.output_dir:
            from pathlib import Path

            out = Path(args.output_dir).expanduser()
            out.mkdir(parents=True, exist_ok=True)
            for i, obj in enumerate(objects):
                path = out / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
                path.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
            print(f"wrote {len(objects)} objects to {out}")
            return None
        print(yaml.safe_dump_all(objects, sort_keys=False), end="")
        return None

    def _cmd_connect(self, args, cell):
        return api.connect(args.name, args.backend, timeout=args.timeout or self.ready_timeout)

    def _cmd_list(self, args, cell):
        from .ui.logview import widgets_available

        if widgets_available():
            from .ui import cluster_list

            cluster_list.show(api.backend(args.backend))
            return None
        from .ui.render import ListView

        display(ListView(api.list_clusters(args.backend)))
        return None

    def _cmd_status(self, args, cell):
        from .ui.render import StatusView

        display(StatusView(api.get(args.name, args.backend).status()))

    def _cmd_wait(self, args, cell):
        from .ui.render import StatusView

        st = api.get(args.name, args.backend).wait(args.timeout)
        display(StatusView(st))

    def _cmd_logs(self, args, cell):
        cluster = api.get(args.name, args.backend)
        if args.task:
            cluster.spec.task(args.task)  # raises TaskNotFound with the valid names
        if args.tail is not None and args.tail < 0:
            raise UsageError(f"--tail {args.tail} must be ≥ 0.")
        if args.follow:
            from .ui.logview import LogView

            LogView(cluster.backend, cluster.name, max_lines=self.log_lines,
                    tasks=[args.task] if args.task else None, announce_status=False).show()
            return None
        print(cluster.logs(args.task, args.tail))
        return None

    def _cmd_tensorboard(self, args, cell):
        from .ui.tensorboard import show_tensorboard

        info = api.get(args.name, args.backend).tensorboard()
        show_tensorboard(info)

    def _cmd_stop(self, args, cell):
        st = api.get(args.name, args.backend).stop()
        print(f"{args.name}: {st.phase}; logs kept in {st.log_dir}")

    def _cmd_delete(self, args, cell):
        kept = api.get(args.name, args.backend).delete(keep_logs=args.keep_logs)
        print(f"{args.name}: deleted" + (f"; logs kept in {kept}" if kept else ""))

    def _cmd_events(self, args, cell):
        import time

        for ev in api.get(args.name, args.backend).events():
            stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
            print(f"{stamp} {ev.type:<8}{ev.task or '-':<12}{ev.reason:<16}{ev.message}")

    def _cmd_dashboard(self, args, cell):
        from .ui import dashboard

        # Shown here, not returned: a returned handle would be displayed a second time.
        dashboard.show(api.get(args.name, args.backend), max_lines=self.log_lines)
        return None


def _int(value: str, flag: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a whole number.") from None
