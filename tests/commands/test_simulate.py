"""`vccc simulate` reads its config through the experiment schema (kind "pipeline")."""

from vccc_jax.commands import simulate as cmd


def _err(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vccc simulate: ")
    return err[0]


def test_simulate_reads_the_schema(tmp_path, capsys):
    assert cmd.main(["--config", "experiments/pipeline_default.toml", "--num-updates", "3"]) == 0
    out = capsys.readouterr().out
    assert "16 workers" in out and "judge" in out and "human" in out
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\nkind = "pipeline"\n[base]\nworkers = 3\n')
    assert cmd.main(["--config", str(bad)]) == 2 and "base.workers" in _err(capsys)
    bad.write_text('name = "b"\nkind = "pipeline"\n[[base.channels]]\nname = "r"\nlag = 1\n')
    assert cmd.main(["--config", str(bad)]) == 2 and "base.channels[0].lag" in _err(capsys)
    bad.write_text('name = "b"\nkind = "pipeline"\n[base]\nbatch_size = 0\n')
    assert cmd.main(["--config", str(bad)]) == 2 and "batch_size" in _err(capsys)
    assert cmd.main(["--config", "experiments/ps_ppo.toml"]) == 2
    assert "kind must be 'pipeline'" in _err(capsys)
