"""``vccc figures``: run every notebook headless on stored results and write figures/.

    vccc figures [--results results] [--out figures] [--only NAME ...]
    vccc figures --gallery docs/figures   # also refresh the docs' small PNGs (make gallery)
    vccc figures --store results/tabular_default.jsonl --out figures   # one sweep store, directly
    vccc figures --ipynb notebooks      # also save the executed notebooks (make notebooks)

Notebooks are jupytext percent scripts (``notebooks/*.py``) with a cell tagged
``parameters`` (``results``, ``out``, ``gallery``; relative paths are taken from the
repository root, so a notebook runs from any directory); papermill injects the values,
nbclient executes them (one kernel shared by all notebooks). ``--ipynb DIR`` writes each
executed notebook, outputs included, as ``DIR/<name>.ipynb`` for Jupyter (git ignores
``*.ipynb``). Before that, the write-up's exact examples are stored under
``<results>/examples/`` (``runs.examples``; seconds, kept if present). A notebook whose
results are absent draws nothing and says so.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

from vccc_jax.commands.common import Parser, fail, guarded, output_dir

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"


def notebooks(names: Optional[list[str]] = None, directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The notebook scripts (all, or those whose stem is in ``names``)."""
    found = sorted(directory.glob("*.py"))
    if names:
        unknown = set(names) - {p.stem for p in found}
        if unknown:
            raise ValueError(f"unknown notebook(s) {sorted(unknown)}; have {[p.stem for p in found]}")
        found = [p for p in found if p.stem in names]
    return found


def load_notebook(path: Path, parameters: dict):
    """Read a percent script as a notebook and inject ``parameters`` after its
    ``parameters`` cell (papermill's convention)."""
    import jupytext
    from papermill.parameterize import parameterize_notebook

    nb = jupytext.read(path)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                          "language": "python"})
    nb.metadata.setdefault("language_info", {"name": "python"})
    nb.metadata.setdefault("papermill", {})
    for cell in nb.cells:  # papermill reads cell.metadata.tags on every cell
        cell.metadata.setdefault("tags", [])
    return parameterize_notebook(nb, parameters)


def execute(nb, cwd: Path, km=None, timeout: int = 600):
    """Execute ``nb`` in ``cwd``; with ``km`` (a started KernelManager) the kernel is reused
    (its namespace is reset first) and left running."""
    from nbclient import NotebookClient

    if km is not None:
        import nbformat

        nb.cells.insert(0, nbformat.v4.new_code_cell(f"%reset -f\nimport os\nos.chdir({str(cwd)!r})"))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", km=km,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(reset_kc=False) if km is not None else client.execute()
    return nb


def save_notebook(nb, path: Path, reused_kernel: bool = True) -> Path:
    """Write an executed notebook (outputs kept) for Jupyter, without the kernel-reset cell
    that :func:`execute` put first when it reused a kernel, and without the jupytext pairing
    metadata (so saving it in Jupyter cannot overwrite ``notebooks/<name>.py``)."""
    import nbformat

    if reused_kernel and nb.cells and nb.cells[0].source.startswith("%reset -f"):
        nb.cells.pop(0)
    nb.metadata.pop("jupytext", None)
    nbformat.validate(nb)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def kernel_manager():
    """A python3 kernel manager talking over IPC sockets in a new temporary directory: over
    TCP (the default) every kernel start prints a warning that its traffic is unencrypted,
    on the console of ``make figures`` and in every notebook."""
    import tempfile

    from jupyter_client.manager import KernelManager

    where = Path(tempfile.mkdtemp(prefix="vccc-kernel-")) / "kernel"
    return KernelManager(kernel_name="python3", transport="ipc", ip=str(where))


def start_kernel():
    """A started python3 kernel (:func:`kernel_manager`; the caller shuts it down:
    ``km.shutdown_kernel()``)."""
    km = kernel_manager()
    km.start_kernel()
    return km


def why_no_figure(nb) -> str:
    """Why an executed notebook drew nothing, in its own words: the lines it printed that
    say what is absent ("stores: none", "missing"), else its last printed line."""
    lines = [line.strip() for cell in nb.cells if cell.get("cell_type") == "code"
             for o in cell.get("outputs", []) if o.get("output_type") == "stream"
             and o.get("name") == "stdout" for line in o.get("text", "").splitlines()
             if line.strip()]
    absent = [line for line in lines if "none" in line or "missing" in line]
    if absent:
        return "; ".join(absent)
    return f"its last output: {lines[-1]}" if lines else "it printed nothing"


def _pngs(out: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in Path(out).glob("*.png")}


def run_notebooks(results: Path, out: Path, gallery: Optional[Path] = None,
                  names: Optional[list[str]] = None, timeout: int = 600, km=None,
                  write_examples: bool = True, log=print, ipynb: Optional[Path] = None,
                  cwd: Path = ROOT) -> dict:
    """Store the exact examples (unless present), then execute each notebook in ``cwd`` with
    ``results`` / ``out`` / ``gallery`` (absolute paths), saving it executed as
    ``<ipynb>/<name>.ipynb`` when ``ipynb`` is given; ``log`` gets one line per notebook:
    its time and the PNGs it wrote, or that it drew no figure and why (:func:`why_no_figure`).
    Returns {stem: {"seconds", "figures" (PNGs written), "why" (why none: "" when some)}}. A
    failing notebook raises (nbclient's CellExecutionError names the cell)."""
    results, out = results.resolve(), out.resolve()
    if write_examples:
        from vccc_jax.runs.examples import write_examples as store_examples

        store_examples(results)
    params = {"results": str(results), "out": str(out),
              "gallery": str(gallery.resolve()) if gallery else ""}
    own = km is None
    km = start_kernel() if own else km
    report = {}
    try:
        for path in notebooks(names):
            t0, before = time.time(), _pngs(out)
            nb = execute(load_notebook(path, params), Path(cwd), km=km, timeout=timeout)
            seconds = time.time() - t0
            if ipynb is not None:
                save_notebook(nb, Path(ipynb) / f"{path.stem}.ipynb", reused_kernel=km is not None)
            drawn = sum(before.get(p) != t for p, t in _pngs(out).items())
            why = "" if drawn else why_no_figure(nb)
            report[path.stem] = {"seconds": seconds, "figures": drawn, "why": why}
            log(f"{path.name}: ran in {seconds:.1f}s, "
                + (f"{drawn} figures" if drawn else f"drew no figure ({why})"))
    finally:
        if own:
            km.shutdown_kernel(now=True)
    return report


def refresh_gallery(staged: Path, gallery: Path) -> str:
    """Copy the small PNGs the notebooks drew into ``staged`` over those ``gallery`` holds
    (the committed docs/figures) and add none: a new figure is added by copying it there once
    (so ``--gallery`` never leaves files git does not know). Returns one line saying what
    was refreshed and what was not added."""
    import shutil

    drawn = sorted(staged.glob("*.png"))
    kept = [p for p in drawn if (gallery / p.name).is_file()]
    for p in kept:
        shutil.copyfile(p, gallery / p.name)
    new = [p.name for p in drawn if p not in kept]
    return (f"gallery: refreshed {len(kept)} PNGs in {gallery}"
            + (f"; {len(new)} drawn that it does not hold were not added (copy one there to "
               f"add it): {', '.join(new)}" if new else ""))


def build_parser() -> Parser:
    p = Parser(prog="vccc figures", description="run every notebook headless on stored results "
               "and write PDF + PNG figures")
    p.add_argument("--results", default="results", help="results directory (default: results)")
    p.add_argument("--out", default="figures", help="output directory (default: figures)")
    p.add_argument("--gallery", default=None,
                   help="also refresh the small PNGs this folder holds (docs/figures: `make "
                   "gallery`); adds none")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these notebooks (stems of notebooks/*.py)")
    p.add_argument("--ipynb", default=None, metavar="DIR",
                   help="also save each executed notebook as DIR/<name>.ipynb (open in Jupyter)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per notebook cell")
    p.add_argument("--store", default=None,
                   help="draw the staleness-sweep figures of one store file directly (no notebooks)")
    return p


@guarded("figures")
def main(argv: Optional[list[str]] = None):
    from vccc_jax.runs.store import is_store, read_rows

    args = build_parser().parse_args(argv)
    if args.timeout < 1:
        raise ValueError(f"--timeout must be >= 1 second, got {args.timeout}")
    if args.store is not None:
        store = Path(args.store)
        if not is_store(store):  # a file, or a store's shard files (runs.store)
            return fail("figures", f"no result store at {store}")
        output_dir(args.out, "--out")

        def draw_store() -> int:
            from vccc_jax import plotting

            paths = plotting.make_figures(read_rows(store), Path(args.out) / store.stem)
            print(f"{store}: {len(paths)} files in {Path(args.out) / store.stem}")
            return 0 if paths else 1

        return draw_store
    results = Path(args.results)
    if not results.is_dir():
        return fail("figures", f"no results directory at {results}")
    names = notebooks(args.only)  # unknown names -> ValueError -> one line, exit 2
    output_dir(args.out, "--out")
    if args.gallery:
        output_dir(args.gallery, "--gallery")

    def draw() -> int:
        import tempfile

        from vccc_jax.runs.store import read_every_store

        read_every_store(results)  # a bad store warns here, not only inside a notebook
        with tempfile.TemporaryDirectory(prefix="vccc-gallery-") as staged:
            report = run_notebooks(results, Path(args.out),
                                   Path(staged) if args.gallery else None,
                                   [p.stem for p in names], timeout=args.timeout,
                                   ipynb=Path(args.ipynb) if args.ipynb else None)
            if args.gallery:
                print(refresh_gallery(Path(staged), Path(args.gallery)), file=sys.stdout)
        drawn = sum(r["figures"] for r in report.values())
        print(f"{drawn} figures (PNG + PDF) drawn in {args.out}", file=sys.stdout)
        empty = {name: r["why"] for name, r in report.items() if not r["figures"]}
        if empty:
            print(f"{len(empty)} of {len(report)} notebooks drew no figure (results absent: the "
                  "commands are in each notebook's first cell): " + ", ".join(
                      f"{name} ({why})" for name, why in empty.items()), file=sys.stdout)
        return 0 if drawn else 1

    return draw
