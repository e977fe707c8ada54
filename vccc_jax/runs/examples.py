"""Store the write-up's exact small examples as JSON (``results/examples/<name>.json``).

The computations are :mod:`vccc_jax.analysis.examples` (NumPy, exact); this module only
writes them with provenance, so notebooks load stored results like every other figure.
``vccc figures`` calls :func:`write_examples` before it runs the notebooks (seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

from vccc_jax.analysis import examples
from vccc_jax.runs.provenance import provenance

EXAMPLES = {
    "bandit": examples.bandit_example,          # Sec 4.1 and its variance table
    "covariance": examples.covariance_example,  # Eq 3 per state
    "vtrace": examples.vtrace_example,          # Eq 11 trade-offs (lambda, n, rho_bar != c_bar)
}


def write_examples(results_dir: str | Path, names=None, force: bool = False) -> list[Path]:
    """Compute and write ``<results_dir>/examples/<name>.json`` ({"name", "data",
    "provenance"}) for each example (all by default); existing files are kept unless
    ``force``. Returns the paths."""
    out = Path(results_dir) / "examples"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or EXAMPLES:
        path = out / f"{name}.json"
        if force or not path.exists():
            doc = {"name": name, "data": EXAMPLES[name](), "provenance": provenance()}
            path.write_text(json.dumps(doc, indent=1))
        paths.append(path)
    return paths


def read_example(results_dir: str | Path, name: str) -> dict:
    """The ``data`` of a stored example."""
    return json.loads((Path(results_dir) / "examples" / f"{name}.json").read_text())["data"]
