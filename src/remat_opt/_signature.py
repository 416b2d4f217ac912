"""The input signature of a call: what a plan made in memory is kept under.

Two calls share a plan when their arguments have the same tree structure and
static leaves (:mod:`remat_opt.program._static`), and each array leaf the same
shape, dtype and, on a mesh, sharding. Values never matter: a plan depends on
what XLA compiles, which they do not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from .memory._measure import mesh_sharding
from .program._static import Static, split


@dataclass(frozen=True)
class Signature:
    """A call's arguments as the planner sees them.

    Attributes:
        static: the tree structure and its static leaves (compared by equality, or identity).
        avals: per array leaf, its shape, dtype and sharding over a mesh (or ``None``).
    """

    static: Static
    avals: tuple[tuple[tuple[int, ...], str, Any], ...]


def signature(args: tuple, kwargs: dict) -> Signature:
    """The signature of a call on ``args`` and ``kwargs`` (arrays, abstract values or static leaves)."""
    leaves, static = split((args, kwargs))
    return Signature(static, tuple((tuple(jax.numpy.shape(x)), str(jax.numpy.result_type(x)), mesh_sharding(x))
                                   for x in leaves))
