"""``vccc bench routes`` (issue 13): row selection, the per-route configs and the table
(columns, ratios against the exact route) on hand-made rows. Nothing compiles here: a real
run compiles one whole trainer per route (~10 s of CPU each even at tiny shapes)."""

import pytest

from vccc_jax.benchmarks import routes

ROWS = [routes.RouteRow("exact", 2.0, 0.5, 100_000, 20.0, temp_bytes=4096,
                        argument_bytes=2048, ring_bytes=1024, route_state_bytes=0,
                        model_copies=8, model_bytes=1024, cpu_s=0.4),
        routes.RouteRow("ewma", 2.5, 0.625, 100_000, 21.0, temp_bytes=6144,
                        argument_bytes=2304, ring_bytes=1024, route_state_bytes=256,
                        model_copies=1, model_bytes=128, cpu_s=0.5)]


def test_select_rows():
    assert routes.select_rows(" exact, off ,") == ["exact", "off"]
    with pytest.raises(ValueError, match="unknown routes"):
        routes.select_rows("exact,snapshot")
    with pytest.raises(ValueError, match="empty"):
        routes.select_rows(",")


def test_configs_are_speed_runs_of_each_route():
    cfg = routes.config("off", 3, num_envs=2, num_steps=8)
    assert cfg.pi_old_route == "" and cfg.gt_every == 0 and cfg.num_updates == 3
    for route in ("exact", "ewma", "behaviour"):
        cfg = routes.config(route, 2)
        assert cfg.pi_old_route == route and cfg.gt_every == 0
        assert cfg.sampler == routes.DEFAULTS["sampler"] and cfg.resolved_num_versions == 8


def test_table_columns_and_ratios_against_exact():
    lines = routes.format_table(ROWS).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:3] == ["route", "env steps/s", "vs exact"] and head[-1] == "final return"
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    exact = [c.strip() for c in lines[2].strip("|").split("|")]
    ewma = [c.strip() for c in lines[3].strip("|").split("|")]
    assert exact[:3] == ["exact", "200.0k", "1.00x"]
    assert ewma[:5] == ["ewma", "160.0k", "0.80x", "0.50", "0.80x"]  # speed and cpu ratios
    assert ewma[6:10] == ["6.0", "1.50x", "2.2", "1.12x"]  # temp / argument KiB and ratios
    assert ewma[10:14] == ["0.2", "1.0", "1", "0.1"]  # route state, ring, model copies / KiB
    # without the exact row the ratios are "-"
    assert [c.strip() for c in routes.format_table(ROWS[1:]).splitlines()[2].split("|")][3] == "-"
    assert routes.as_rows(ROWS)[1]["steps_per_s"] == pytest.approx(160_000.0)
