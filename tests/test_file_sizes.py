"""No library file above 600 lines (DESIGN.md section 2: each file one idea; issue 28).

Every ``.py`` file under ``vccc_jax/`` is counted, sub-packages included; the failure names
each offender with its line count, longest first.
"""

from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vccc_jax"
LIMIT = 600


def long_files(root: Path, limit: int = LIMIT) -> list[tuple[str, int]]:
    """(path relative to ``root``, lines) of every ``.py`` file under ``root`` with more than
    ``limit`` lines, longest first (ties by path)."""
    counts = [(str(p.relative_to(root)), len(p.read_text().splitlines()))
              for p in root.rglob("*.py")]
    return sorted(((p, n) for p, n in counts if n > limit), key=lambda x: (-x[1], x[0]))


def test_no_library_file_above_600_lines():
    offenders = long_files(PKG)
    assert not offenders, f"library files above {LIMIT} lines: " + ", ".join(
        f"vccc_jax/{p} ({n} lines)" for p, n in offenders)


def test_the_checker_names_each_over_long_file(tmp_path):
    """A synthetic tree: files of 601 and 700 lines (one nested) are named with their counts,
    longest first; 600 lines (the limit itself) and non-Python files are not."""
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    sizes = {"at_limit.py": 600, "one_over.py": 601, "sub/deeper/long.py": 700,
             "sub/short.py": 3, "sub/notes.txt": 900}
    for name, n in sizes.items():
        (tmp_path / name).write_text("".join(f"x{i} = {i}\n" for i in range(n)))
    assert long_files(tmp_path) == [("sub/deeper/long.py", 700), ("one_over.py", 601)]
    assert long_files(tmp_path, limit=700) == []
    assert long_files(tmp_path, limit=2) == [("sub/deeper/long.py", 700), ("one_over.py", 601),
                                             ("at_limit.py", 600), ("sub/short.py", 3)]
