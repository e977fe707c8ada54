"""The ONE grid expansion of the package: the product of named axes, last axis fastest.

Every kind of experiment (tabular sweeps, async actor-critic grids, training grids) expands
its ``[grid]`` table with :func:`product`; the order (``itertools.product`` over the axes in
the order given) is part of the result rows' identity, so it never changes.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence


def product(axes: Sequence[tuple[str, Sequence[Any]]]) -> list[dict]:
    """[{name: value, ...}] for every point of the grid spanned by ``axes``.

    >>> product([("a", [1, 2]), ("b", ["x"])])
    [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}]
    """
    names = [n for n, _ in axes]
    return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in axes))]
