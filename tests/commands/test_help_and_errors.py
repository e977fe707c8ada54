"""Every ``vccc`` command: ``--help`` works, and bad input gives exactly one line
``vccc <command>: <what is wrong>`` on stderr with exit status 2 and no traceback
(in-process ``cli.main``; every case fails in validation, before any compute).

The table below is the error contract of issue 23: configs (TOML syntax, unknown keys, a value
of the wrong type at any depth), ``--set`` overrides, flags, and output locations that cannot
be created, across all commands."""

import subprocess
import sys

import pytest

from vccc_jax import cli
from vccc_jax.runs.schema import dumps

SWEEP = {"name": "t", "kind": "tabular_sweep",
         "base": {"num_mdps": 2, "families": [{"name": "g", "kind": "garnet", "num_states": 4,
                                               "num_actions": 2, "branching": 2}],
                  "history": {"num_versions": 4}, "train": {"num_updates": 10}},
         "grid": {"laws": ["fixed"], "mean_lags": [0, 1], "methods": ["vccc"]}}
FAMILY = SWEEP["base"]["families"][0]
TRAIN = {"name": "t", "kind": "train", "base": {"num_envs": 4}, "grid": {"lag": ["fixed:0"]}}
ASYNC = {"name": "a", "kind": "async_ac", "base": {"ac": {"num_chunks": 2}}, "grid": {}}
PIPE = {"name": "p", "kind": "pipeline", "base": {"num_workers": 4}}


def _with(table, part, **changes):
    """``table`` with ``table[part]`` updated (``part`` None: the top level)."""
    if part is None:
        return dict(table, **changes)
    return dict(table, **{part: dict(table[part], **changes)})


def _family(**changes):
    return _with(SWEEP, "base", families=[dict(FAMILY, **changes)])


# (command, argv with {toml} / {tmp} / {file}, config table written to {toml} or None,
#  text the one-line message must contain)
CASES = [
    # --- vccc sweep: config files
    ("sweep", ["--config", "{tmp}/missing.toml"], None, "not found"),
    ("sweep", ["--config", "{toml}"], "name = ", "not valid TOML"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, None, colour="red"), "unknown key 'colour'"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "base", nmdps=2),
     "unknown key base.nmdps (did you mean num_mdps?"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "base", num_mdps="two"),
     "base.num_mdps must be an integer, got 'two'"),
    ("sweep", ["--config", "{toml}"], _family(num_states="five"),  # issue 23: 51-line traceback
     "base.families[0].num_states must be an integer, got 'five'"),
    ("sweep", ["--config", "{toml}"], _family(gamma="high"),
     "base.families[0].gamma must be a number"),
    ("sweep", ["--config", "{toml}"], _family(colour=1), "unknown key base.families[0].colour"),
    ("sweep", ["--config", "{toml}"], _family(kind="torus"),
     "base.families[0].kind must be one of garnet, random, chain"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "base", history={"num_versions": 1.5}),
     "base.history.num_versions must be an integer"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "base", train={"enabled": "yes"}),
     "base.train.enabled must be a boolean"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "base", methods={"vtrace": {"n": [1]}}),
     "base.methods.vtrace.n must be a number, string or boolean"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "grid", mean_lags=[0, "one"]),
     "grid.mean_lags[1] must be a number"),
    ("sweep", ["--config", "{toml}"], _with(SWEEP, "grid", laws=["cauchy"]),
     "grid.laws has 'cauchy'"),
    ("sweep", ["--config", "{toml}"], TRAIN, "runs with `vccc train`"),
    ("sweep", ["--config", "{toml}"], PIPE, "runs with `vccc simulate`"),
    ("sweep", ["--config", "{toml}"], _with(ASYNC, "base", ac={"num_chunks": "many"}),
     "base.ac.num_chunks must be an integer"),
    ("sweep", ["--config", "{toml}"], _with(ASYNC, "base", family={"kind": "chain"}),
     "base.family.kind must be one of random, garnet"),
    ("sweep", ["--config", "{toml}"], {"name": "d", "kind": "decoupled",
                                       "grid": {"noises": 0.3}}, "grid.noises must be a list"),
    ("sweep", ["--config", "{toml}"], {"name": "r", "kind": "rac",
                                       "base": {"delays": [0, "2"]}},
     "base.delays[1] must be an integer"),
    ("sweep", ["--config", "{toml}"], {"name": "c", "kind": "critic_free",
                                       "base": {"groups": "eight"}},
     "base.groups must be an integer"),
    # --- vccc sweep: --set, flags, outputs
    ("sweep", ["--config", "{toml}", "--set", "base.num_mdps"], SWEEP, "expected KEY=VALUE"),
    ("sweep", ["--config", "{toml}", "--set", "base.num_mdps=four"], SWEEP,
     "with --set: base.num_mdps must be an integer, got 'four'"),
    ("sweep", ["--config", "{toml}", "--set", "num_mdps=4"], SWEEP, "keys are name,"),
    ("sweep", ["--config", "{toml}", "--set", "base.families[3].gamma=1"], SWEEP,
     "base.families has no item 3"),
    ("sweep", ["--config", "{toml}", "--set", "kind=rac"], SWEEP, "the kind of an experiment"),
    ("sweep", ["--config", "{toml}", "--results", "{file}/results"], SWEEP,
     "--results {file}/results: cannot create directory"),
    ("sweep", ["--config", "{toml}", "--results", "{tmp}", "--figures", "{file}/f"], SWEEP,
     "--figures {file}/f: cannot create directory"),
    ("sweep", ["--config", "{toml}", "--track", "mlflow"], SWEEP, "--track must be none"),
    ("sweep", ["--config", "{toml}", "--export", "tsv"], SWEEP, "invalid choice: 'tsv'"),
    ("sweep", ["--config", "{toml}", "--dry-run", "--export", "csv"], SWEEP, "not allowed with"),
    ("sweep", ["--config", "{toml}", "--results", "{tmp}", "--export", "csv"], SWEEP,
     "--export: no result store"),
    ("sweep", ["--bogus"], None, "unrecognized arguments: --bogus"),
    # --- vccc train: flags and TOML types of --config (run directories: tests/commands/test_train.py)
    ("train", ["--env", "Nope-v0"], None, "env 'Nope-v0' is not a gymnax environment"),
    ("train", ["--lag", "cauchy:3"], None, "lag"),
    ("train", ["--critic", "clipped"], None, "clipped"),
    ("train", ["--seeds", "many"], None, "--seeds"),
    ("train", ["--config", "{tmp}/x.toml"], None, "not found"),
    ("train", ["--track", "mlflow"], None, "--track must be none"),
    ("train", ["--dry-run", "--hidden", "0"], None, "hidden must be >= 1, got 0"),
    ("train", ["--config", "{toml}"], _with(TRAIN, "base", num_envs="four"),
     "base.num_envs must be an integer, got 'four'"),
    ("train", ["--config", "{toml}"], _with(TRAIN, "base", normalize_advantages=3),
     "base.normalize_advantages must be a boolean"),
    ("train", ["--config", "{toml}"], _with(TRAIN, "base", colour=1), "unknown key base.colour"),
    ("train", ["--config", "{toml}"], _with(TRAIN, None, grid={"lag": "fixed:0"}),
     "grid.lag must be a list"),
    ("train", ["--config", "{toml}"], _with(TRAIN, None, grid={"lag": [5]}),
     "grid.lag[0] must be a string"),
    ("train", ["--config", "{toml}"], _with(TRAIN, None, grid={"colour": [1]}),
     "unknown key grid.colour"),
    ("train", ["--config", "{toml}", "--set", "base.num_envs=x"], TRAIN,
     "base.num_envs must be an integer, got 'x'"),
    ("train", ["--set", "base.num_envs=8"], None, "--set overrides a --config file"),
    # --- vccc simulate
    ("simulate", ["--config", "{tmp}/missing.toml"], None, "not found"),
    ("simulate", ["--config", "{toml}"], _with(PIPE, "base", num_workers="many"),
     "base.num_workers must be an integer"),
    ("simulate", ["--config", "{toml}", "--set", "base.bogus=1"], PIPE, "unknown key base.bogus"),
    ("simulate", ["--config", "{toml}", "--schedule", "nope"], PIPE, "invalid choice: 'nope'"),
    ("simulate", ["--config", "{toml}", "--trace-out", "{file}/lags.txt"], PIPE,
     "--trace-out {file}/lags.txt: cannot create directory"),
    ("simulate", ["--config", "{toml}"], SWEEP, "kind must be 'pipeline'"),
    # --- vccc verify
    ("verify", ["--num-mdps", "1"], None, "--num-mdps must be >= 4"),
    ("verify", ["--samples", "1"], None, "--samples must be >= 2"),
    ("verify", ["--json", "{file}/v.json"], None, "cannot write --json"),
    # --- vccc figures
    ("figures", ["--results", "{tmp}/none"], None, "no results directory"),
    ("figures", ["--store", "{tmp}/none.jsonl"], None, "no result store"),
    ("figures", ["--results", "{tmp}", "--only", "nope"], None, "unknown notebook(s) ['nope']"),
    ("figures", ["--results", "{tmp}", "--out", "{file}/figs"], None,
     "--out {file}/figs: cannot create directory"),
    ("figures", ["--timeout", "0"], None, "--timeout must be >= 1"),
    # --- vccc bench
    ("bench", ["nope"], None, "expected one of"),
    ("bench", ["commands", "--only", "nope"], None, "unknown command row(s) ['nope']"),
    ("bench", ["commands", "--out", "{file}/t.md"], None, "--out {file}/t.md: cannot create"),
    ("bench", ["estimators", "--sizes", "1"], None, "expected T,B"),
    ("bench", ["tabular", "--repeats", "0"], None, "--repeats"),
    # --- vccc async-mc
    ("async-mc", ["--starts", "0,x"], None, "--starts"),
    ("async-mc", ["--starts", "2,5"], None, "starts"),
    ("async-mc", ["--rollouts", "0"], None, "--rollouts must be >= 1"),
    # --- vccc list
    ("list", ["nope"], None, "invalid choice: 'nope'"),
    ("list", [], None, "the following arguments are required: what"),
]


def _argv(argv, tmp_path, config):
    toml, a_file = tmp_path / "c.toml", tmp_path / "a_file"
    a_file.write_text("not a directory")
    if config is not None:
        toml.write_text(config if isinstance(config, str) else dumps(config))
    subs = {"{toml}": str(toml), "{tmp}": str(tmp_path), "{file}": str(a_file)}

    def sub(text):
        for k, v in subs.items():
            text = text.replace(k, v)
        return text

    return [sub(a) for a in argv], sub


def _one_line_error(capsys, argv, command, match):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vccc {command}: "), err
    assert match in lines[0], lines[0]
    assert "Traceback" not in err


def test_the_table_covers_every_command():
    assert len(CASES) >= 30
    assert {c[0] for c in CASES} == set(cli.COMMANDS)


@pytest.mark.parametrize("command,argv,config,match", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_2(command, argv, config, match, tmp_path, capsys):
    argv, sub = _argv(argv, tmp_path, config)
    _one_line_error(capsys, [command, *argv], command, sub(match))
    assert not (tmp_path / "results").exists()  # nothing ran


def test_config_errors_come_before_jax_is_imported(tmp_path):
    """A bad sweep or simulate config (a type deep in a nested table, a bad --set, an output
    directory that cannot be made) is reported without importing JAX (issue 23: errors came
    after seconds of imports)."""
    bad = tmp_path / "bad.toml"
    bad.write_text(dumps(_family(num_states="five")))
    ok = tmp_path / "ok.toml"
    ok.write_text(dumps(SWEEP))
    (tmp_path / "a_file").write_text("")
    code = (
        "import sys\nfrom vccc_jax import cli\n"
        f"assert cli.main(['sweep', '--config', {str(bad)!r}]) == 2\n"
        f"assert cli.main(['sweep', '--config', {str(ok)!r}, '--set', 'base.seed=x']) == 2\n"
        f"assert cli.main(['sweep', '--config', {str(ok)!r}, '--results', "
        f"{str(tmp_path / 'a_file' / 'r')!r}]) == 2\n"
        f"assert cli.main(['sweep', '--config', {str(ok)!r}, '--export', 'csv', '--results', "
        f"{str(tmp_path)!r}]) == 2\n"
        f"assert cli.main(['simulate', '--config', {str(bad)!r}]) == 2\n"
        "assert 'jax' not in sys.modules, 'JAX was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 5 and "base.families[0].num_states must be an integer" in lines[0]


def test_top_level_help_and_version(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS) and "--version" in out
    assert cli.main(["nope"]) == 2 and "unknown command" in capsys.readouterr().err
    from vccc_jax import __version__

    assert cli.main(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"vccc {__version__} (") and "jax " in line


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_help_works(name, capsys):
    try:
        rc = cli.main([name, "--help"])  # bench answers itself; argparse exits
    except SystemExit as e:
        rc = e.code
    assert rc in (0, None)
    assert "usage" in capsys.readouterr().out.lower()


def test_readme_exit_table_lists_every_exit_status_the_commands_use():
    """Issue 30: exit 3 (a store or run directory in use) was missing from the README."""
    import re
    from pathlib import Path

    from vccc_jax.commands.common import EXIT_BAD_INPUT, EXIT_BUSY
    from vccc_jax.commands.interrupt import EXIT_INTERRUPTED

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = dict(re.findall(r"^\| *(\d+) *\| *(.+?) *\|$", readme, flags=re.M))
    assert {"0", "1", str(EXIT_BAD_INPUT), str(EXIT_BUSY), str(EXIT_INTERRUPTED)} <= set(rows)
    assert "busy" in rows[str(EXIT_BUSY)] and "bad input" in rows[str(EXIT_BAD_INPUT)]
