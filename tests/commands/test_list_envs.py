"""`vccc list envs` names every env family ``--env`` accepts: each gymnax name, one row per
``KIND:`` spec prefix (``envs.spec.SPEC_KINDS``) with its keys, and the Brax env names when
Brax is installed (a stand-in ``brax`` module here; the real extra is optional)."""

import sys
import types

import pytest

from vccc_jax.commands import listing
from vccc_jax.envs import spec
from vccc_jax.envs.make import ENVS


def _rows(text: str) -> dict:
    """{first column: whole line} of a listing table (header and rule left out)."""
    return {line.split()[0]: line for line in text.splitlines()[2:]}


def test_every_env_family_has_a_row_with_its_keys(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)  # as without the extra: import fails
    rows = _rows(listing.envs())
    assert set(ENVS) <= set(rows)
    by_kind = {name.partition(":")[0]: line for name, line in rows.items() if ":" in name}
    assert set(by_kind) == set(spec.SPEC_KINDS)
    keys = {"tabular": spec.TABULAR_KEYS, "lqr": spec.LQR_KEYS, "brax": spec.BRAX_KEYS}
    for kind, table in keys.items():
        assert by_kind[kind].split("keys: ")[1].split(";")[0].split()[:len(table)] == list(table)
    assert "pip install -e '.[brax]'" in by_kind["brax"]


@pytest.fixture
def fake_brax(monkeypatch):
    envs = types.ModuleType("brax.envs")
    envs._envs = {"hopper": object, "ant": object, "fast": object}
    brax = types.ModuleType("brax")
    brax.envs = envs
    monkeypatch.setitem(sys.modules, "brax", brax)
    monkeypatch.setitem(sys.modules, "brax.envs", envs)


def test_installed_brax_names_are_listed(fake_brax):
    from vccc_jax.envs.brax_env import brax_env_names

    assert brax_env_names() == ("ant", "fast", "hopper")
    row = _rows(listing.envs())["brax:NAME,KEY=V,..."]
    assert row.endswith("NAME: ant fast hopper") and "pip install" not in row
