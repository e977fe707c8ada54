"""Imports flow one way: estimators <- tabular, envs <- train <- sweeps, cli, plotting, benchmarks."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "vccc_jax"
RANK = {"estimators": 0, "tabular": 1, "envs": 1, "train": 2,
        "sweeps": 3, "plotting": 3, "cli": 3, "benchmarks": 3}
# Same-rank imports allowed only within a layer; tabular and envs are independent.


def layer_of(module: str):
    parts = module.split(".")
    if parts[0] != "vccc_jax" or len(parts) < 2:
        return None
    return parts[1]


def imported_layers(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        for m in mods:
            layer = layer_of(m)
            if layer in RANK:
                yield layer, node.lineno
                break


FILES = sorted(p for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0].removesuffix(".py") in RANK)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_upward_or_sideways_imports(path):
    own = path.relative_to(PKG).parts[0].removesuffix(".py")
    for layer, line in imported_layers(path):
        if layer == own:
            continue
        assert RANK[layer] < RANK[own] or (RANK[own] == 3 and RANK[layer] == 3), (
            f"{path.relative_to(PKG)}:{line} imports vccc_jax.{layer} (layer {RANK[layer]}) "
            f"from layer {own} ({RANK[own]})")
