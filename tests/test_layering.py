"""Imports flow strictly downward (ranks as in vccc_jax/__init__.py, issue 9), no module imports
itself through a cycle, and every module of ``cli.py``'s lazy command table resolves.

Rank of a module = rank of its top-level folder under ``vccc_jax``; a module may import
modules of strictly lower rank or of its own folder. No same-rank exemption across folders.
Within a folder, the module graph must still be acyclic (checked on the whole package).
"""

import ast
import importlib.util
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "vccc_jax"
RANK = {
    "estimators": 0, "tabular": 1, "pipeline": 1, "envs": 2, "train": 3, "verify": 4,
    "analysis": 4, "testing": 5, "plotting": 5, "runs": 5, "benchmarks": 5, "commands": 6, "cli": 7,
}
TOP = {"__init__": -1}  # vccc_jax/__init__.py: the package root, imports nothing of ours


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


FILES = sorted(PKG.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve(name: str) -> str | None:
    """The module of ours that ``name`` denotes (a module, or a package's attribute)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(path: Path):
    """(module of ours, line) for every import in a file (relative imports resolved)."""
    here = module_name(path)
    pkg = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                root = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(root + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for n in names:
            m = resolve(n)
            # A package's own __init__ runs before any of its modules anyway: not an edge.
            if m is not None and m != here and not here.startswith(m + "."):
                yield m, node.lineno


GRAPH = {m: sorted({t for t, _ in imports_of(p)}) for m, p in MODULES.items()}


def test_every_folder_has_a_rank():
    folders = {folder(m) for m in MODULES} - set(TOP)
    assert folders <= set(RANK), f"folders without a rank: {sorted(folders - set(RANK))}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_go_strictly_down(path):
    own = folder(module_name(path))
    if own in TOP:
        return
    for target, line in imports_of(path):
        layer = folder(target)
        if layer == own or layer in TOP:
            continue
        assert RANK[layer] < RANK[own], (
            f"{path.relative_to(PKG)}:{line} imports {target} (layer {layer}, rank "
            f"{RANK[layer]}) from layer {own} (rank {RANK[own]})")


def test_module_graph_is_acyclic():
    """Depth-first search over every import edge (package __init__ edges included)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in GRAPH.get(m, []):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_a_cycle_would_be_found():
    """The checker itself: a two-module cycle in a toy graph is reported."""
    graph = {"a": ["b"], "b": ["a"]}
    seen, on_stack = set(), []

    def has_cycle(m):
        if m in on_stack:
            return True
        if m in seen:
            return False
        seen.add(m)
        on_stack.append(m)
        found = any(has_cycle(t) for t in graph[m])
        on_stack.pop()
        return found

    assert has_cycle("a")


def test_cli_command_table_resolves():
    from vccc_jax import cli

    for name, (module, _) in cli.COMMANDS.items():
        assert module in MODULES, f"vccc {name}: {module} is not a module of the package"
        assert importlib.util.find_spec(module) is not None
        tree = ast.parse(MODULES[module].read_text())
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        assert mains, f"vccc {name}: {module} has no main(argv)"


BELOW_COMMANDS = [p for p in FILES if folder(module_name(p)) not in ("commands", "cli")]


def _ids(p):
    return str(p.relative_to(PKG))


def print_lines(source: str) -> list[int]:
    """Lines of the calls to the builtin ``print`` in a module's source."""
    return sorted(n.lineno for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print")


@pytest.mark.parametrize("path", BELOW_COMMANDS, ids=_ids)
def test_no_argparse_below_commands(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert "argparse" not in names, f"{path.relative_to(PKG)}:{node.lineno} imports argparse"


@pytest.mark.parametrize("path", BELOW_COMMANDS, ids=_ids)
def test_no_print_below_commands(path):
    """Issue 9: only ``commands/`` and ``cli.py`` print; lower layers return rows/strings."""
    lines = print_lines(path.read_text())
    assert not lines, f"{path.relative_to(PKG)}: print at lines {lines}"


def test_print_checker_sees_a_print():
    """The checker itself: print calls are found (methods named print are not)."""
    assert print_lines("def f():\n    x.print(1)\n    print('x')\nprint(2)\n") == [3, 4]
