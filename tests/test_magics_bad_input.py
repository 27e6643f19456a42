"""Every user mistake gets one clear sentence (UsageError) and leaves nothing behind."""

import pytest
from IPython.core.error import UsageError

from tests.conftest import processes_of, snapshot


@pytest.fixture
def ip(state_dir, workdir):
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()  # one shell per test session
    shell.run_line_magic("load_ext", "tfk8s_magics")
    return shell


def run(ip, line, cell=None):
    if cell is None:
        return ip.run_line_magic("tfcluster", line)
    return ip.run_cell_magic("tfcluster", line, cell)


SCRIPT = "print('hello')\n"

BAD = [
    ("", None, "needs a subcommand"),
    ("frobnicate x", None, "unknown subcommand 'frobnicate': the subcommands are launch, "),
    ("launch ok --bogus 1", SCRIPT,
     "%tfcluster launch: unknown option --bogus (%tfcluster launch --help lists its options)"),
    ("launch Bad_Name", SCRIPT, "cluster name 'Bad_Name' is not valid"),
    ("launch " + "a" * 41, SCRIPT, "is not valid: use at most 40"),
    ("launch ok --workers 0", SCRIPT, "needs at least 1 worker"),
    ("launch ok --workers -3", SCRIPT, "--workers -3 is out of range"),
    ("launch ok --ps -1", SCRIPT, "--ps -1 is out of range"),
    ("launch ok --workers many", SCRIPT, "'many' is not a whole number"),
    ("launch ok --mode sideways", SCRIPT, "unknown mode 'sideways'"),
    ("launch ok --mode in-graph --ps 1 --workers 1", SCRIPT, "in-graph launch takes no cell body"),
    ("launch ok --mode in-graph --ps 0 --workers 1", None, "needs at least 1 ps and 1 worker"),
    ("launch ok", None, "needs a training script"),
    ("launch ok --script /no/such/file.py", None, "does not exist"),
    ("launch ok", "def broken(:\n", "does not compile"),
    ("launch ok", "import no_such_module_xyz\n", "imports no_such_module_xyz, found neither in"),
    ("launch ok", "\n\ndef broken(:\n", "does not compile: invalid syntax at <cell> line 4"),
    ("launch ok --ps 1", "import tensorflow as tf\ns = tf.distribute.MultiWorkerMirroredStrategy()\n",
     "waits forever when the cluster has parameter servers (--ps 1): launch it with --ps 0"),
    ("launch ok --ps 2", "from tensorflow.distribute import MultiWorkerMirroredStrategy as M\n",
     "builds tf.distribute.MultiWorkerMirroredStrategy"),
    ("launch ok --file /no/such/helper.py", SCRIPT, "--file '/no/such/helper.py' does not exist"),
    ("launch ok --force", SCRIPT, "--force only goes with --replace"),
    ("launch ok --workers  # a comment, not arguments", None, "argument --workers: expected one argument"),
    ("connect nope --shards 0", None, "--shards 0 is out of range: give a count from 1"),
    ("resolver nope", None, "no local cluster named 'nope'"),
    ("launch ok --env NOEQUALS", SCRIPT, "is not KEY=VALUE"),
    ("launch ok --env TF_CONFIG=x", SCRIPT, "TF_CONFIG is set by tfk8s"),
    ("launch ok --ps-grace -5", SCRIPT, "--ps-grace -5 is not valid"),
    ("launch ok --restarts -1", SCRIPT, "--restarts -1 is out of range"),
    ("launch ok --data-size lots", SCRIPT, "--data-size 'lots' is not a Kubernetes quantity"),
    ("launch ok --log-size 5GB", SCRIPT, "--log-size '5GB' is not a Kubernetes quantity"),
    ("launch ok --backend nowhere", SCRIPT, "unknown backend 'nowhere'"),
    ("launch ok 'unclosed", SCRIPT, "check the quotes"),
    ("logs nope", None, "no local cluster named 'nope'"),
    ("status nope", None, "no local cluster named 'nope'"),
    ("stop nope", None, "no local cluster named 'nope'"),
    ("delete nope", None, "no local cluster named 'nope'"),
    ("connect nope", None, "no local cluster named 'nope'"),
    ("status nope", "print(1)", "takes no cell body"),
]


@pytest.mark.parametrize("line, cell, message", BAD, ids=[b[0] or "<empty>" for b in BAD])
def test_bad_input_is_one_sentence_and_leaves_nothing(ip, state_dir, workdir, line, cell, message):
    before_state, before_work = snapshot(state_dir), snapshot(workdir)
    with pytest.raises(UsageError) as err:
        run(ip, line, cell)
    text = str(err.value)
    assert message in text
    assert "\n" not in text.strip(), "one sentence, no traceback"
    assert snapshot(state_dir) - before_state <= {"clusters"}
    assert not list((state_dir / "clusters").glob("*")) if (state_dir / "clusters").exists() else True
    assert snapshot(workdir) == before_work
    assert processes_of(state_dir) == []


@pytest.mark.slow
def test_name_in_use_unknown_task_and_bad_tail(ip, state_dir):
    run(ip, "launch dup --workers 1 --ps 0 --no-follow", "import time\ntime.sleep(600)\n")
    before = snapshot(state_dir)
    with pytest.raises(UsageError, match=r"cluster 'dup' is still (starting|running): stop it first "
                                         r"\(%tfcluster stop dup\) and run the launch again"):
        run(ip, "launch dup --workers 1 --ps 0", SCRIPT)
    with pytest.raises(UsageError, match="has no task 'worker-9': its tasks are worker-0"):
        run(ip, "logs dup worker-9")
    with pytest.raises(UsageError, match="'boss-0' is not a task name"):
        run(ip, "logs dup boss-0")
    with pytest.raises(UsageError, match="--tail -2 is out of range"):
        run(ip, "logs dup worker-0 --tail -2")
    with pytest.raises(UsageError, match="is between-graph"):
        run(ip, "connect dup")
    # The existing cluster was not touched by the failed attempts.
    assert {p for p in snapshot(state_dir) - before if not p.endswith((".log", ".json", ".jsonl"))} == set()
    run(ip, "stop dup")
    run(ip, "delete dup")


def test_help_lists_subcommands(ip, capsys):
    run(ip, "--help")
    out = capsys.readouterr().out
    for sub in ("launch", "connect", "logs", "tensorboard", "render", "delete"):
        assert sub in out


# -- issue 27 item 8: "did you mean", per-subcommand help, one sentence in both front ends -------
def test_an_unknown_subcommand_is_one_sentence_ending_with_a_period(ip):
    with pytest.raises(UsageError) as err:
        run(ip, "frobnicate x")
    said = str(err.value)
    assert said.startswith("unknown subcommand 'frobnicate': the subcommands are launch, ")
    assert said.endswith("(%tfcluster --help).") and said.count(". ") == 0, said


@pytest.mark.parametrize("line, message", [
    ("launch x --wokers 2", "%tfcluster launch: unknown option --wokers; did you mean --workers? "
                            "(%tfcluster launch --help lists its options)"),
    ("logs x --tial 3", "unknown option --tial; did you mean --tail?"),
    ("lauch x", "unknown subcommand 'lauch'; did you mean launch?"),
    ("staus x", "unknown subcommand 'staus'; did you mean status?"),
])
def test_a_typo_names_the_closest_flag_or_subcommand(ip, line, message):
    with pytest.raises(UsageError) as err:
        run(ip, line, SCRIPT if line.startswith("launch") else None)
    assert message in str(err.value)
    assert "usage:" not in str(err.value)


def test_top_level_help_points_to_each_subcommands_full_help(ip, capsys):
    run(ip, "--help")
    assert "`%tfcluster SUBCOMMAND --help` lists a subcommand's options." in capsys.readouterr().out
    run(ip, "launch --help")
    out = capsys.readouterr().out
    assert "--workers N" in out and "--ps N" in out and "--replace" in out


@pytest.mark.parametrize("argv, message", [
    (["submit", "x", "--wokers", "2"], "tfk8s launch: unknown option --wokers; did you mean --workers? "
                                       "(tfk8s launch --help lists its options)"),
    (["lisst"], "tfk8s: unknown subcommand 'lisst'; did you mean list?"),
    (["launch", "x", "--workers", "abc"], "tfk8s launch: argument --workers: 'abc' is not a whole number"),
    (["frobnicate"], "tfk8s: unknown subcommand 'frobnicate': the subcommands are "),
])
def test_the_cli_says_its_mistakes_in_one_cli_sentence(argv, message, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", *argv], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "TFK8S_STATE_DIR": str(tmp_path)},
                         timeout=120)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr
    assert "usage:" not in out.stderr and "%tfcluster" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_cli_never_tells_a_terminal_to_use_a_cell(tmp_path):
    """A terminal has no cell: a launch without a script is told to give --script."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "TFK8S_STATE_DIR": str(tmp_path)}
    for argv, says in ((["launch", "x"], "needs a training script: give it as --script PATH."),
                       (["launch", "x", "--mode", "in-graph", "--ps", "1", "--script", __file__],
                        "an in-graph launch takes no --script"),
                       (["frobnicate"], "(tfk8s --help).")):
        out = subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", *argv], capture_output=True,
                             text=True, env=env, timeout=120)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert "cell" not in out.stderr and out.stderr.rstrip().endswith("."), out.stderr


@pytest.mark.parametrize("line, argv", [
    ("list  # the cluster's list", ["list"]),
    ('logs x --tail 5 # "unclosed in a comment', ["logs", "x", "--tail", "5"]),
    ("launch x --env A=b#c  # it's kept", ["launch", "x", "--env", "A=b#c"]),
    ("launch x --env 'A=# not a comment'", ["launch", "x", "--env", "A=# not a comment"]),
    ('launch x --env "B=\\"#\\"" #c', ["launch", "x", "--env", 'B="#"']),
    ("#only a comment", []),
])
def test_a_comment_on_a_magic_line_is_cut_before_quotes_are_parsed(line, argv):
    import shlex

    from tfk8s_magics.magics import _without_comment

    assert shlex.split(_without_comment(line)) == argv


def test_a_magic_line_whose_comment_has_an_apostrophe_runs(ip, capsys):
    run(ip, "list  # the cluster's list")
    assert "no clusters" in capsys.readouterr().out
