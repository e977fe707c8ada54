"""Each runner computes only the units of work its shard owns and returns what the store
holds (issue 22): the train grid runner, with the trainer replaced by a pure function so
nothing compiles. (Tabular groups: tests/commands/test_shards.py; run_cells:
tests/runs/test_launch.py.)"""

from vccc_jax.runs import train as runs_train
from vccc_jax.runs.store import Shard, cell_id, read_rows, sharded, table_rows
from vccc_jax.train.config import TrainConfig

CELLS = [TrainConfig(lag=f"fixed:{k}", num_versions=8, total_timesteps=2048) for k in range(6)]


def _fake_run_one(cfg, out, **_):
    return {"final_return": {"mean": float(cfg.lag.split(":")[1]), "ci95": 0.0}}, []


def test_train_grid_shards_union_equals_one_process(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(runs_train, "run_one",
                        lambda cfg, out, **kw: ran.append(cfg.lag) or _fake_run_one(cfg, out))
    one = runs_train.run_grid("g", CELLS, tmp_path / "one", quiet=True)
    assert len(one) == 6 and len(ran) == 6
    owner = {c.lag: [Shard(i, 2).owns(cell_id(c.to_dict())) for i in range(2)].index(True)
             for c in CELLS}
    assert set(owner.values()) == {0, 1}  # (these six ids: both shards get cells)
    got = []
    for i in range(2):
        ran.clear()
        with sharded(Shard(i, 2)):
            got.append(runs_train.run_grid("g", CELLS, tmp_path / "many", quiet=True))
        assert sorted(ran) == sorted(lag for lag, o in owner.items() if o == i)
    # shard 0 saw only its own cells; shard 1 also saw shard 0's (already in the store)
    assert [r["config"]["lag"] for r in got[0]] == [c.lag for c in CELLS if owner[c.lag] == 0]
    assert got[1] == one
    assert table_rows(read_rows(tmp_path / "many" / "g.jsonl")) == table_rows(
        read_rows(tmp_path / "one" / "g.jsonl"))
    ran.clear()
    assert runs_train.run_grid("g", CELLS, tmp_path / "many", quiet=True) == one and ran == []


def test_train_grid_cells_share_one_program_cache(tmp_path, monkeypatch):
    """run_grid owns ONE ProgramCache and hands it to every cell (cells that differ only in
    grid values then compile once: tests/train/test_trainer.py); a new grid, a new cache."""
    from vccc_jax.train.programs import ProgramCache

    caches = []
    monkeypatch.setattr(runs_train, "run_one", lambda cfg, out, **kw: caches.append(
        kw["programs"]) or _fake_run_one(cfg, out))
    runs_train.run_grid("g", CELLS, tmp_path / "a", quiet=True)
    assert len(caches) == 6 and isinstance(caches[0], ProgramCache)
    assert all(c is caches[0] for c in caches)
    runs_train.run_grid("g", CELLS, tmp_path / "b", quiet=True)
    assert caches[6] is not caches[0]
