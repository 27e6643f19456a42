"""``%tfcluster`` / ``%%tfcluster``: thin magics over :mod:`tfk8s_magics.api`.

Each subcommand parses its arguments (no shell: ``shlex`` only; every flag
and its type from :mod:`tfk8s_magics.options`) and makes one call of the
public API.  Usage mistakes raise ``UsageError`` with one sentence; the
defaults are traitlets an administrator sets for everyone
(``c.TFClusterMagics.default_workers = 4`` in an IPython config file).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from . import api, options
from .errors import ClusterExists, ClusterNotFound, NoPreviousRun, SpecError, TaskNotFound
from .taskenv import import_tensorflow
from .ui import cluster_list, dashboard, summary
from .ui.logview import LogView, widgets_available
from .ui.render import ListView, StatusView, events_text, status_html
from .ui.serving import show_serving
from .ui.tensorboard import show_tensorboard
from .yamltext import dump_yaml

SUBCOMMANDS = tuple(options.COMMANDS)


class _Parser(options.SuggestingParser):
    """argparse that reports mistakes as one UsageError sentence instead of exiting."""

    def fail(self, sentence: str) -> None:
        raise UsageError(sentence)

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            raise UsageError(message.strip())
        raise _HelpShown()


class _HelpShown(Exception):
    pass


def _without_comment(line: str) -> str:
    """``line`` without its comment: as in a shell, an unquoted word starting with ``#`` begins one.

    The comment is cut before the line is split, so quotes inside it (``# the cluster's``) are
    not parsed; a ``#`` inside a word (``--env A=b#c``) or in quotes is kept.
    """
    quote = None
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


#: The magic's traitlets, one per option with a ``trait`` (see :func:`options.defaults_class`).
MagicDefaults = options.defaults_class(
    "MagicDefaults", "Defaults of %tfcluster an administrator sets for everyone."
)


@magics_class
class TFClusterMagics(Magics, MagicDefaults):
    """The ``%tfcluster`` magics.  Every trait is a default an admin can set (``%config TFClusterMagics``)."""

    # -- parsing -----------------------------------------------------------
    def _parser(self) -> _Parser:
        defaults = options.defaults(options.trait_values(self))
        return options.build_parser("%tfcluster", defaults, _Parser)

    def _parse(self, line: str) -> argparse.Namespace | None:
        try:
            argv = shlex.split(_without_comment(line))
        except ValueError as e:
            raise UsageError(f"%tfcluster: cannot parse {line!r}: {e}; check the quotes.") from None
        if not argv:
            raise UsageError(f"%tfcluster needs a subcommand: one of {', '.join(SUBCOMMANDS)}.")
        if argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
            raise UsageError(options.unknown_subcommand(argv[0], SUBCOMMANDS, "%tfcluster"))
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
        if cell is not None and not options.COMMANDS[args.cmd].takes_cell and cell.strip():
            raise UsageError(
                f"%%tfcluster {args.cmd} takes no cell body; only `launch` and `render` do (the script)."
            )
        try:
            return getattr(self, f"_cmd_{args.cmd}")(args, cell)
        except (SpecError, ClusterExists, ClusterNotFound, NoPreviousRun, TaskNotFound) as e:
            raise UsageError(str(e)) from None

    # -- subcommands ---------------------------------------------------------
    def _spec(self, args: argparse.Namespace, cell: str | None, kwargs: dict | None = None):
        # The body starts on the cell's second line: one leading newline makes every
        # line number (syntax errors, tracebacks) match the cell the user sees.
        script = "\n" + cell if cell is not None and cell.strip() else None
        if kwargs is None:
            kwargs = {o.name: getattr(args, o.name) for o in options.spec_options()}
        return api.make_spec(args.name, script=script, **kwargs)

    def _cmd_launch(self, args, cell):
        spec = self._spec(args, cell)
        backend = api.resolve_backend(args.backend)
        if backend.supports("pool"):
            # c.TFClusterMagics.pool_size / pool_idle, if an admin set them
            backend.warm_pool().configure(self.pool_size, self.pool_idle)
        cluster = api.launch(spec, backend=backend, detach=args.detach,
                             replace=args.replace, force=args.force)
        board = None
        if args.show_dashboard:
            if widgets_available():
                board = dashboard.show(cluster, max_lines=self.log_lines)
            else:
                LogView(cluster.backend, cluster.name, max_lines=self.log_lines).show()

        # Once the cluster ends, the static record a saved notebook keeps: the dashboard's
        # HTML/text alternative (no second copy under the live view), else an output of its own.
        summary.show(cluster, view=board)
        if spec.mode == "in-graph":
            try:
                cluster.wait_ready(self.ready_timeout)
            except KeyboardInterrupt:  # one sentence, not the traceback of a wait
                _interrupted(cluster, "its servers to be ready")
                return None
            print(f"{spec.name}: every server is ready; `strategy = %tfcluster connect {spec.name}` "
                  "makes this kernel the client, or — for code that builds its own strategy (as "
                  f"TensorFlow's tutorial does) — `resolver = %tfcluster resolver {spec.name}`.")
        return None

    def _cmd_render(self, args, cell):
        kwargs, serving = api.serving_secret_apart(
            {o.name: getattr(args, o.name) for o in options.spec_options()},
            args.source_url if args.serve_model else None)
        spec = self._spec(args, cell, kwargs)
        objects = api.render_objects(spec, args.backend, tensorboard=args.tensorboard)
        if args.serve_model:
            objects += api.render_serving(spec, args.serve_model, args.backend, **serving)
        if args.output_dir:
            out = Path(args.output_dir).expanduser()
            out.mkdir(parents=True, exist_ok=True)
            for i, obj in enumerate(objects):
                path = out / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
                path.write_text(dump_yaml([obj]), encoding="utf-8")
            print(f"wrote {len(objects)} objects to {out}")
            return None
        print(dump_yaml(objects), end="")
        return None

    def _cmd_connect(self, args, cell):
        strategy_options = {}
        if args.shards is not None or args.min_shard_bytes is not None:
            strategy_options["variable_partitioner"] = _partitioner(args.shards, args.min_shard_bytes)
        return api.connect(args.name, args.backend, timeout=args.timeout or self.ready_timeout,
                           **strategy_options)

    def _cmd_resolver(self, args, cell):
        return api.resolver(args.name, args.backend, timeout=args.timeout or self.ready_timeout)

    def _cmd_list(self, args, cell):
        backend = api.resolve_backend(args.backend)
        if widgets_available():
            cluster_list.show(backend)
        else:
            display(ListView(api.list_clusters(backend)))
        if backend.supports("pool") and (line := backend.warm_pool().memory_line()):
            print(line)  # what the warm pools of this user hold: they are not shown anywhere else
        return None

    def _cmd_status(self, args, cell):
        display(StatusView(api.get(args.name, args.backend).status()))

    def _cmd_wait(self, args, cell):
        cluster = api.get(args.name, args.backend)
        try:
            st = cluster.wait(args.timeout)
        except KeyboardInterrupt:
            _interrupted(cluster, "it to end")
            return
        if st.terminal:
            summary.finish_all(cluster.backend, cluster.name, st)
        display(StatusView(st))

    def _cmd_logs(self, args, cell):
        cluster = api.get(args.name, args.backend)
        if args.task:
            cluster.spec.task(args.task)  # raises TaskNotFound with the valid names
        if args.tail is not None:  # no --tail: every line
            options.OPTIONS["tail"].validate(args.tail)
        if args.previous:
            print(cluster.logs(args.task, args.tail, previous=True))
            return None
        if args.follow:
            LogView(cluster.backend, cluster.name, max_lines=self.log_lines,
                    tasks=[args.task] if args.task else None, announce_status=False).show()
            return None
        if args.task:
            print(cluster.logs(args.task, args.tail))
            return None
        for task, text in cluster.logs_by_task(args.tail).items():
            print(f"==> {task} <==")
            print(text)
        return None

    def _cmd_tensorboard(self, args, cell):
        info = api.get(args.name, args.backend).tensorboard()
        show_tensorboard(info)

    def _cmd_stop(self, args, cell):
        cluster = api.get(args.name, args.backend)
        st = cluster.stop()
        summary.finish_all(cluster.backend, cluster.name, st)
        print(f"{args.name}: {st.phase}; logs kept in {st.log_dir}")

    def _cmd_delete(self, args, cell):
        cluster = api.get(args.name, args.backend)
        summary.finish_all(cluster.backend, cluster.name, final=True)  # while its logs exist
        kept = cluster.delete(keep_logs=args.keep_logs, force=args.force)
        summary.finish_all(cluster.backend, cluster.name, deleted=True)
        print(f"{args.name}: deleted" + (f"; logs kept in {kept}" if kept else ""))

    def _cmd_events(self, args, cell):
        events = api.get(args.name, args.backend).events()
        print(events_text(events, last=len(events)))

    def _cmd_serve(self, args, cell):
        cluster = api.get(args.name, args.backend)
        if args.stop_serving:
            what = "serving stopped and removed" if cluster.serve(stop=True) else "nothing was being served"
            print(f"{args.name}: {what}")
            return None
        show_serving(cluster.serve(model=args.model, replicas=args.replicas, cpu=args.serving_cpu,
                                   memory=args.serving_memory, source_url=args.source_url,
                                   credentials_secret=args.credentials_secret))
        return None

    def _cmd_pool(self, args, cell):
        if args.size is not None:
            self.pool_size = args.size  # checked like c.TFClusterMagics.pool_size
        pool = api.warm_pool(args.backend)
        if args.size == 0:
            pool.resize(0)  # the user's pool empties, then this kernel leaves it
        pool.configure(self.pool_size, self.pool_idle)
        if args.size:
            pool.start()
            pool.resize(args.size)  # the pool is the user's: a running one takes the new size
        print(pool.status_text())

    def _cmd_dashboard(self, args, cell):
        # Shown here, not returned: a returned handle would be displayed a second time.
        dashboard.show(api.get(args.name, args.backend), max_lines=self.log_lines)
        return None


def cluster_html(cluster: api.Cluster) -> str:
    """The HTML view of a :class:`~tfk8s_magics.api.Cluster` handle in a notebook: its status."""
    return status_html(cluster.status())


def _partitioner(shards: int | None, min_shard_bytes: int | None):
    """TensorFlow's variable partitioner for ``--shards N`` and/or ``--min-shard-bytes B``."""
    shards = options.OPTIONS["shards"].validate(shards) if shards is not None else None
    if min_shard_bytes is not None:
        min_shard_bytes = options.OPTIONS["min_shard_bytes"].validate(min_shard_bytes)
    partitioners = import_tensorflow().distribute.experimental.partitioners
    if min_shard_bytes is None:
        return partitioners.FixedShardsPartitioner(shards)
    return partitioners.MinSizePartitioner(min_shard_bytes=min_shard_bytes, max_shards=shards or 1 << 16)


def _interrupted(cluster: api.Cluster, waiting_for: str) -> None:
    """Say in one sentence what an interrupted wait leaves behind (the cluster goes on)."""
    try:
        st = cluster.status()
        where = f"{st.phase}" + (f": {st.cannot_start or st.reason}" if st.cannot_start or st.reason else "")
    except Exception:  # noqa: BLE001 - the sentence must come out whatever the backend says
        where = "its state could not be read"
    print(f"{cluster.name}: interrupted while waiting for {waiting_for}; the cluster goes on "
          f"({where}): `%tfcluster status {cluster.name}` shows it, "
          f"`%tfcluster stop {cluster.name}` ends it.")
