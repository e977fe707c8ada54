"""``vccc bench``: every sub-command's --help, and bad input -> one line
``vccc bench: <what is wrong>`` with exit status 2. Nothing here measures anything: the
benchmarks only parse their flags (the work runs in a thunk these tests never call)."""

import os

import pytest

from vccc_jax import cli
from vccc_jax.commands import bench

NAMES = ("estimators", "tabular", "train", "scale", "routes", "device", "commands", "mutants",
         "counts", "async")


def _one_line_error(capsys, argv, match):
    rc = cli.main(["bench", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vccc bench: "), err
    assert match in lines[0], lines[0]


def test_cli_points_at_the_command():
    assert cli.COMMANDS["bench"][0] == "vccc_jax.commands.bench"
    assert set(bench.BENCHMARKS) == set(NAMES)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bench_help_lists_every_benchmark(flag, capsys):
    assert cli.main(["bench", flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: vccc bench")
    assert all(name in out for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sub_command_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", name, "--help"])
    assert e.value.code in (0, None)
    out = capsys.readouterr().out
    assert f"usage: vccc bench {name}" in out


@pytest.mark.parametrize("name", NAMES)
def test_unknown_flag_is_one_line(name, capsys):
    _one_line_error(capsys, [name, "--bogus"], "unrecognized arguments: --bogus")


def test_unknown_or_missing_benchmark(capsys):
    _one_line_error(capsys, ["nope"], "expected one of estimators, tabular, train, scale, routes, device, commands, mutants, counts, async, got 'nope'")
    _one_line_error(capsys, [], "got nothing")


@pytest.mark.parametrize("argv, match", [
    (["estimators", "--sizes", "128,x"], "expected T,B"),
    (["estimators", "--sizes", "128,4096,2"], "expected T,B"),
    (["estimators", "--reps", "-1"], "--reps"),
    (["estimators", "--dtypes", "float16"], "subset of float32,float64"),
    (["estimators", "--dtypes", "float32,float32"], "subset of float32,float64"),
    (["tabular", "--repeats", "0"], "--repeats"),
    (["tabular", "--min-time", "fast"], "--min-time"),
    (["train", "--rows", "sync-gae,nope"], "unknown rows ['nope']"),
    (["train", "--rows", ","], "--rows is empty"),
    (["train", "--seeds", "many"], "--seeds"),
    (["train", "--rows", "sync-gae", "--actor", "sometimes"], "actor"),
    (["train", "--continuous", "--rows", "lag8-vtrace"], "unknown rows ['lag8-vtrace']"),
    (["train", "--continuous", "--rows", "sync-gae", "--actor", "centered-ratio"], "score centring (Eq 13) sums"),
    (["scale", "--envs-per-device", "x"], "--envs-per-device"),
    (["routes", "--routes", "exact,snapshot"], "unknown routes ['snapshot']"),
    (["routes", "--updates", "0"], "--updates"),
    (["routes", "--lag", "bogus"], "lag must look like"),
    (["commands", "--only", "help", "--readme", "no/such/README.md"], "no such file"),
    (["commands", "--only", "help", "--readme", "pyproject.toml", "--out", "x.md"], "markers"),
    (["commands", "--only", "help", "--readme", "README.md"], "--readme needs --out"),
])
def test_bad_values_are_one_line(argv, match, capsys):
    _one_line_error(capsys, argv, match)


def test_valid_flags_return_the_work_without_running_it():
    """Validation only: main's guarded phase returns a thunk (the measurement) for valid flags."""
    undecorated = bench.main.__wrapped__
    for argv in (["estimators", "--quick", "--sizes", "8,16"],
                 ["estimators", "--dtypes", "float64", "--crossover", "--no-targets"],
                 ["tabular", "--small"],
                 ["train", "--rows", "reference,lag8-vccc", "--timesteps", "1024"],
                 ["scale", "--devices", "1"], ["routes", "--routes", "exact,off", "--updates", "2"],
                 ["device", "--out", "x", "--sections", "host,vtrace", "--budget", "60"]):
        assert callable(undecorated(argv)), argv


def test_async_bench_refuses_a_zero_size(capsys):
    _one_line_error(capsys, ["async", "--updates", "0"], "must be >= 1")


def test_estimators_host_devices_needs_the_devices(capsys, monkeypatch):
    """--host-devices N once JAX runs with fewer devices: a one-line error naming the count
    (XLA_FLAGS is left as the test process has it)."""
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "")
                       + " --xla_force_host_platform_device_count=1")
    _one_line_error(capsys, ["estimators", "--host-devices", "64"],
                    "--host-devices 64: JAX sees")
