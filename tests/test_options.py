"""The options registry: one name, type, default and check per option, everywhere."""

from __future__ import annotations

import argparse

import pytest
from traitlets import TraitError
from traitlets.config import Config

import tfk8s_magics as tk
from tfk8s_magics import cli, options
from tfk8s_magics.errors import SpecError
from tfk8s_magics.magics import TFClusterMagics

SCRIPT = "print('hi')\n"


def magic_args(line: str, config: Config | None = None) -> argparse.Namespace:
    return TFClusterMagics(shell=None, config=config or Config())._parse(line)


def cli_args(argv: list[str]) -> argparse.Namespace:
    return cli._parser().parse_args(argv)


def test_workers_and_ps_default_alike_in_the_magic_the_cli_and_the_api():
    for args in (magic_args("launch a"), cli_args(["launch", "a"])):
        assert (args.workers, args.ps) == (2, 0)
    spec = tk.make_spec("a", script=SCRIPT)
    assert (spec.workers, spec.ps) == (2, 0)
    assert (tk.ClusterSpec("a", script=SCRIPT).workers, tk.ClusterSpec("a", script=SCRIPT).ps) == (2, 0)


def test_flags_are_typed_from_the_first_hop():
    args = magic_args("launch a --workers 3 --ps-grace 1.5 --restarts 4 --gpus 1 --env A=1 --env B=2")
    assert (args.workers, args.ps_grace_period, args.restart_budget, args.gpus) == (3, 1.5, 4, 1)
    assert type(args.workers) is int and type(args.ps_grace_period) is float
    assert args.env == [("A", "1"), ("B", "2")]
    assert magic_args("launch a --no-legacy-keras --no-dashboard").legacy_keras is False
    assert cli_args(["logs", "a", "-f", "--tail", "3"]).tail == 3


def test_every_flag_of_the_registry_reaches_both_front_ends():
    magic = TFClusterMagics(shell=None)._parser()
    terminal = cli._parser()
    for parser, commands in ((magic, options.COMMANDS), (terminal, cli._RUN)):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert set(sub.choices) == set(commands)
        for name, sp in sub.choices.items():
            dests = {a.dest for a in sp._actions}
            assert {o.name for o in options.for_command(name)} <= dests, name


def test_an_environment_variable_sets_the_default_everywhere(monkeypatch):
    monkeypatch.setenv("TFK8S_RESTARTS", "7")
    monkeypatch.setenv("TFK8S_PS_GRACE", "0")
    monkeypatch.setenv("TFK8S_LEGACY_KERAS", "0")
    assert TFClusterMagics(shell=None).restart_budget == 7
    for args in (magic_args("launch a"), cli_args(["launch", "a"])):
        assert (args.restart_budget, args.ps_grace_period, args.legacy_keras) == (7, 0.0, False)
    spec = tk.make_spec("a", script=SCRIPT)
    assert (spec.restart_budget, spec.ps_grace_period, spec.legacy_keras) == (7, 0.0, False)
    # an explicit value still wins
    assert tk.make_spec("a", script=SCRIPT, restart_budget=1).restart_budget == 1


def test_a_traitlet_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("TFK8S_RESTARTS", "7")
    c = Config()
    c.TFClusterMagics.restart_budget = 3
    c.TFClusterMagics.default_workers = 4
    args = magic_args("launch a", c)
    assert (args.restart_budget, args.workers) == (3, 4)


def test_a_bad_environment_variable_is_named(monkeypatch):
    monkeypatch.setenv("TFK8S_RESTARTS", "lots")
    with pytest.raises(SpecError, match=r"TFK8S_RESTARTS='lots' is not valid for --restarts.*fix or unset"):
        tk.make_spec("a", script=SCRIPT)


def test_a_bad_traitlet_fails_with_the_flag_s_sentence():
    c = Config()
    c.TFClusterMagics.default_ps = -1
    with pytest.raises(TraitError, match=r"--ps -1 is out of range"):
        TFClusterMagics(shell=None, config=c).default_ps  # noqa: B018 - reading validates


def test_unknown_launch_keyword_is_named():
    with pytest.raises(SpecError, match="unknown launch option 'wokers'"):
        tk.make_spec("a", script=SCRIPT, wokers=2)


def test_launch_takes_a_spec_or_options_not_both(tmp_path):
    spec = tk.make_spec("a", script=SCRIPT)
    with pytest.raises(SpecError, match="give one or the other"):
        tk.launch(spec, workers=3, backend="local")


def test_every_option_has_help_and_a_default_its_type_accepts():
    for opt in options.OPTIONS.values():
        assert opt.help and len(opt.help) > 5, opt.name
        default = opt.builtin_default()
        if default is not None and opt.action == "store" and opt.env:
            assert opt.type(opt.to_env(default)) == default, opt.name
