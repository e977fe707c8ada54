"""``vccc sweep`` scaling flags (issue 10): bad meshes are one line and exit 2 before anything
runs. (The sharded rows themselves: tests/runs/test_sharded_sweep.py.)"""

from pathlib import Path

from vccc_jax.commands import sweep as cmd

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "experiments" / "tabular_smoke.toml")


def test_bad_mesh_flags_are_one_line(tmp_path, capsys):
    base = ["--config", SMOKE, "--results", str(tmp_path), "--no-figures", "--no-progress"]
    assert cmd.main(base + ["--devices", "64"]) == 2
    assert "64 devices" in capsys.readouterr().err
    assert cmd.main(base + ["--mesh", "data=2,batch=2"]) == 2
    assert "unknown axis 'batch'" in capsys.readouterr().err
    assert cmd.main(["--config", str(ROOT / "experiments" / "async_ac.toml"),
                     "--devices", "1"]) == 2
    assert "split tabular sweeps" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_multihost_flags_need_all_three(capsys):
    assert cmd.main(["--config", SMOKE, "--coordinator", "127.0.0.1:1"]) == 2
    assert "num_processes and process_id" in capsys.readouterr().err
