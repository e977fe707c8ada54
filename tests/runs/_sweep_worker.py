"""Subprocess worker (8 fake CPU devices): a subset of the smoke tabular sweep run on one
device and split over an (8, 1) mesh, into two stores. Writes OUT/rows.json:
{"one": table rows, "mesh": table rows}."""

import os
import sys

os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                           + os.environ.get("XLA_FLAGS", ""))  # + the suite's (conftest.py)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

from vccc_jax.runs import schema, tabular_config  # noqa: E402
from vccc_jax.runs.store import read_rows, table_rows  # noqa: E402
from vccc_jax.runs.tabular_sweep import run_sweep  # noqa: E402
from vccc_jax.train import sharding as sh  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def subset() -> dict:
    table = tomllib.loads((ROOT / "experiments" / "tabular_smoke.toml").read_text())
    table["base"]["train"]["num_updates"] = 60
    table["grid"].update(laws=["geometric"], mean_lags=[1, 4], clips=[2.0],
                         methods=["vccc", "truncated"], method_clips={})
    return tabular_config.config_of(schema.parse(table, "smoke subset"))


def main(out: str) -> None:
    assert jax.device_count() == 8
    cfg = subset()
    got = {}
    for name, mesh in (("one", None), ("mesh", sh.make_mesh((8, 1)))):
        path, rows = run_sweep(cfg, Path(out) / name, progress=False, mesh=mesh)
        assert len(rows) == len(read_rows(path))
        got[name] = [{k: r[k] for k in ("id", "cell", "metrics")} for r in table_rows(rows)]
    Path(out, "rows.json").write_text(json.dumps(got))


if __name__ == "__main__":
    main(sys.argv[1])
