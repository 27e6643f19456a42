"""``tfk8s``: the subcommands of ``%tfcluster``, for a terminal (as Arena users expect).

``tfk8s submit NAME --script train.py --workers 2`` (``submit`` is
``launch``), ``tfk8s list``, ``tfk8s get NAME`` (``status``), ``tfk8s logs
NAME [TASK] [-f]``, ``tfk8s delete NAME``.  A cluster launched from a
terminal is detached (it outlives the command) unless ``--follow`` is
given, which streams its logs until it ends.

It sits on :mod:`tfk8s_magics.api` and parses with the same registry as
the magic (:mod:`tfk8s_magics.options`), so every flag is the magic's flag
with the same type and default.  ``connect`` and ``dashboard`` need a
notebook and are not offered here.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable

from . import api, options
from .errors import ClusterExists, ClusterNotFound, NoPreviousRun, SpecError, TaskNotFound, TFClusterError
from .ui.render import events_text, list_text, status_text
from .ui.serving import serving_text
from .ui.stream import Overwrites
from .yamltext import dump_yaml

_ALIASES = {"submit": "launch", "get": "status", "rm": "delete", "ls": "list"}
#: Mistakes in what the user typed: exit code 2, like argparse's own.
_USAGE_ERRORS = (SpecError, ClusterExists, ClusterNotFound, NoPreviousRun, TaskNotFound)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; return the exit code (0 ok, 1 failed, 2 usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv:
        argv[0] = _ALIASES.get(argv[0], argv[0])
    parser = _parser()
    args = parser.parse_args(argv)  # exits 2 with argparse's message on a usage mistake
    if args.cmd is None:
        parser.print_help()
        return 2
    try:
        return _RUN[args.cmd](args)
    except _USAGE_ERRORS as e:
        print(f"tfk8s: {cli_syntax(str(e))}", file=sys.stderr)
        return 2
    except TFClusterError as e:
        print(f"tfk8s: {cli_syntax(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


#: The one flag only a terminal has: a notebook shows the dashboard instead.
_FOLLOW = options.Option("follow", options.parse_bool, False,
                         "stream the logs until the cluster ends (and do not detach)",
                         commands=("launch",), action="store_true")


def cli_syntax(text: str) -> str:
    """An error's advice in this command line's syntax: the library's sentences name the
    notebook's ``%tfcluster SUBCOMMAND ...``, which here is ``tfk8s SUBCOMMAND ...`` (the same
    subcommands and flags).  What only a notebook has (a cell body) is said the terminal's way."""
    for notebook, terminal in _NOTEBOOK_ONLY:
        text = text.replace(notebook, terminal)
    return text.replace("%%tfcluster ", "tfk8s ").replace("%tfcluster ", "tfk8s ")


#: The library's advice that names a notebook's cell, and what a terminal offers instead.
_NOTEBOOK_ONLY = (
    ("put it in the cell body of %%tfcluster launch, or give --script PATH", "give it as --script PATH"),
    ("takes no cell body or --script", "takes no --script"),
    ("run the training code in a normal cell after", "run the training code in a Python session after"),
)


class _Parser(options.SuggestingParser):
    """The CLI's mistakes: ``tfk8s: <one sentence>`` on stderr, exit 2 (the usage block is --help's)."""

    def fail(self, sentence: str) -> None:
        print(sentence if sentence.startswith("tfk8s") else f"tfk8s: {sentence}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    return options.build_parser("tfk8s", options.defaults(), _Parser, commands=_RUN, extra=[_FOLLOW])


def _launch(args: argparse.Namespace) -> int:
    spec = api.make_spec(args.name, **{o.name: getattr(args, o.name) for o in options.spec_options()})
    detach = args.detach or not args.follow
    cluster = api.launch(spec, backend=args.backend, detach=detach, replace=args.replace, force=args.force)
    print(f"{spec.name}: launched on {cluster.backend.name}"
          + (f" (detached; `tfk8s logs {spec.name} -f` follows it)" if detach else ""))
    return _follow(cluster, None) if args.follow else 0


def _render(args: argparse.Namespace) -> int:
    kwargs, serving = api.serving_secret_apart(
        {o.name: getattr(args, o.name) for o in options.spec_options()},
        args.source_url if args.serve_model else None)
    spec = api.make_spec(args.name, **kwargs)
    objects = api.render_objects(spec, args.backend, args.tensorboard)
    if args.serve_model:
        objects += api.render_serving(spec, args.serve_model, args.backend, **serving)
    print(dump_yaml(objects), end="")
    return 0


def _logs(args: argparse.Namespace) -> int:
    cluster = api.get(args.name, args.backend)
    if args.task:
        cluster.spec.task(args.task)  # raises TaskNotFound with the valid names
    if args.follow:
        return _follow(cluster, args.task)
    tail = None if args.tail is None else options.OPTIONS["tail"].validate(args.tail)
    if args.previous:
        print(cluster.logs(args.task, tail, previous=True))
        return 0
    if args.task:
        print(cluster.logs(args.task, tail))
        return 0
    for task, text in cluster.logs_by_task(tail).items():
        print(f"==> {task} <==")
        print(text)
    return 0


def _follow(cluster: api.Cluster, task: str | None) -> int:
    """Print a cluster's log lines as they come, until it ends; exit 0 only if it succeeded."""
    stream = Overwrites()  # a progress bar's carriage returns update its line in place
    for line in cluster.follow(threading.Event(), tasks=[task] if task else None):
        sys.stdout.write(stream.render([f"[{line.task}] {line.text}"]))
        sys.stdout.flush()
    if stream.open is not None:
        sys.stdout.write("\n")
    st = cluster.status()
    print(f"{st.name}: {st.phase}" + (f" — {st.reason}" if st.reason else ""))
    return 0 if st.phase == "succeeded" else 1


def _status(args: argparse.Namespace) -> int:
    print(status_text(api.get(args.name, args.backend).status()))
    return 0


def _wait(args: argparse.Namespace) -> int:
    st = api.get(args.name, args.backend).wait(args.timeout)
    print(status_text(st))
    return 0 if st.phase == "succeeded" else 1


def _list(args: argparse.Namespace) -> int:
    print(list_text(api.list_clusters(args.backend)))
    return 0


def _events(args: argparse.Namespace) -> int:
    events = api.get(args.name, args.backend).events()
    print(events_text(events, last=len(events)))
    return 0


def _tensorboard(args: argparse.Namespace) -> int:
    info = api.get(args.name, args.backend).tensorboard()
    print(f"{args.name}: TensorBoard at {info.url} (log dir {info.logdir})")
    return 0


def _stop(args: argparse.Namespace) -> int:
    st = api.get(args.name, args.backend).stop()
    print(f"{args.name}: {st.phase}; logs kept in {st.log_dir}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    kept = api.get(args.name, args.backend).delete(keep_logs=args.keep_logs, force=args.force)
    print(f"{args.name}: deleted" + (f"; logs kept in {kept}" if kept else ""))
    return 0


def _serve(args: argparse.Namespace) -> int:
    cluster = api.get(args.name, args.backend)
    if args.stop_serving:
        print(f"{args.name}: " + ("serving stopped and removed" if cluster.serve(stop=True)
                                  else "nothing was being served"))
        return 0
    info = cluster.serve(model=args.model, replicas=args.replicas, cpu=args.serving_cpu,
                         source_url=args.source_url, credentials_secret=args.credentials_secret,
                         memory=args.serving_memory)
    print(serving_text(info))
    if cluster.backend.serving_ends_with_caller:
        # The local server lives as long as the process that started it: this one.
        print("serving until Ctrl-C (the local server exits with this command)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            cluster.serve(stop=True)
    return 0


def _pool(args: argparse.Namespace) -> int:
    if args.size is not None:
        print("tfk8s pool --size: a warm pool belongs to the process that launches (this user's "
              "notebook kernels share one); set TFK8S_POOL_SIZE there or run %tfcluster pool --size N "
              "in a notebook.",
              file=sys.stderr)
        return 2
    found = api.warm_pool(args.backend).describe_all()
    print("\n".join(found) if found else "no warm pool is running")
    return 0


#: The subcommands a terminal offers, each one API call.
_RUN: dict[str, Callable[[argparse.Namespace], int]] = {
    "launch": _launch,
    "render": _render,
    "list": _list,
    "status": _status,
    "logs": _logs,
    "wait": _wait,
    "tensorboard": _tensorboard,
    "stop": _stop,
    "delete": _delete,
    "events": _events,
    "serve": _serve,
    "pool": _pool,
}


if __name__ == "__main__":
    sys.exit(main())
