"""pyproject.toml declares every package vccc_jax imports (issue 19 s4): a module-level import
needs a core dependency, an import inside a function a core or an optional one; and every
core dependency is imported somewhere (none is dead weight). Import names map to
distributions through the installed metadata (``orbax`` -> ``orbax-checkpoint``); a package
that is not installed (an extra such as rlax) is taken to be its own distribution."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(reqs) -> set:
    return {_norm(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in reqs}


def _imports() -> dict:
    """{top-level import name: "module" or "function"} of the third-party imports (module
    level wins), with the files that make them."""
    found: dict = {}
    for path in sorted((ROOT / "vccc_jax").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = set()
        for node in tree.body:  # module level, also inside top-level try / if blocks
            top_level.update(id(n) for n in ast.walk(node)
                             if not isinstance(node, (ast.FunctionDef, ast.ClassDef,
                                                      ast.AsyncFunctionDef)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "vccc_jax":
                    continue
                where = "module" if id(node) in top_level else "function"
                if found.get(top, (None,))[0] != "module":
                    found[top] = (where, path.relative_to(ROOT))
    return found


def test_every_import_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = set().union(*(_requirement_names(v)
                           for v in project["optional-dependencies"].values()))
    dists = packages_distributions()
    imported_core = set()
    for name, (where, path) in sorted(_imports().items()):
        candidates = {_norm(d) for d in dists.get(name, [name])}
        allowed = core if where == "module" else core | extras
        assert candidates & allowed, (f"{path} imports {name!r} at {where} level but "
                                      f"pyproject.toml declares none of {sorted(candidates)}"
                                      f"{'' if where == 'function' else ' as a dependency'}")
        imported_core |= candidates & core
    assert not core - imported_core, f"declared, never imported: {core - imported_core}"
