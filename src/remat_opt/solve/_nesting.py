"""Nested schedules: checkpoints inside checkpoints, on the program's chain.

A flat schedule stores each segment's input once and recomputes the segment
once; its memory cannot fall below about two square roots of the chain. A
nested schedule (:attr:`Schedule.nested`) checkpoints a segment's
recomputation again, recomputing some layers more than once for less memory:
Griewank's binomial checkpointing (Revolve) is the optimal such tree for a
chain of equal steps under a number of stored states.

The chain is the program cut at its articulation positions (where a single
value crosses, :func:`remat_opt.solve._chen.articulation_positions`); a step is the
program between two of them, weighted by its FLOPs. Two families of trees are
built by dynamic programming on it, both minimizing the FLOPs recomputed:

* :func:`revolve_schedule` — Revolve proper: ``s`` stored states, and every
  backward step tapes exactly one step (Griewank & Walther's recursion).
* the tape family (:func:`nested_candidates`) — the same with a memory of
  ``m`` units, where a stored state costs one unit and a taped run of ``k``
  steps costs ``k``: the last segment of a level may tape several steps
  instead of one, which is what remat_opt's own execution model does. With
  ``m`` units it is never more expensive than Revolve with ``m - 1`` states
  under this count.

Units are a proxy for bytes; every tree is then simulated in bytes
(:func:`remat_opt.memory._simulate.simulate`) and measured on XLA before it is used.

References:
    A. Griewank, A. Walther. Algorithm 799: Revolve: An Implementation of
    Checkpointing for the Reverse or Adjoint Mode of Computational
    Differentiation. ACM TOMS 26(1), 2000.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import accumulate

import numpy as np

from ._chen import articulation_positions
from ..program._graph import ProgramGraph
from .._schedule import Schedule

_INF = math.inf

MAX_DEPTH = 3
"""Levels of checkpoints a tree may have: each level reruns its segments once
more, and XLA compiles every level's backward separately."""


MAX_STEPS = 64
"""Steps of the chain, at most: beyond, the narrowest articulation position of
each of ``MAX_STEPS - 1`` equal windows bounds a step (the search grows with
the cube of the steps)."""


def chain_steps(graph: ProgramGraph) -> tuple[int, ...]:
    """Boundaries of the chain's steps: ``0``, articulation positions, and the end."""
    n = graph.num_positions
    points = articulation_positions(graph)
    if len(points) >= MAX_STEPS:
        windows = MAX_STEPS - 1
        kept = []
        for w in range(windows):
            inside = [p for p in points if w * n // windows <= p < (w + 1) * n // windows]
            if inside:
                kept.append(min(inside, key=lambda c: (graph.crossing_bytes(c), c)))
        points = tuple(kept)
    return (0, *points, n)


def _step_flops(graph: ProgramGraph, bounds: tuple[int, ...]) -> tuple[int, ...]:
    """Cumulative primal FLOPs at each boundary (``prefix[j] - prefix[i]`` is steps ``i:j``)."""
    per_position = [0] * graph.num_positions
    for u in graph.primal:
        per_position[graph.units[u].position] += graph.units[u].flops
    steps = [sum(per_position[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return (0, *accumulate(steps))


def chain_trees(
    prefix: Sequence[float], tape: bool, max_depth: int = MAX_DEPTH
) -> Callable[[int], tuple[float, Schedule | None]]:
    """The dynamic program on a chain of ``len(prefix) - 1`` steps, step ``i``
    costing ``prefix[i + 1] - prefix[i]`` FLOPs.

    ``cost(i, j, m, d)``, the fewest FLOPs to reverse steps ``i:j`` with their
    input stored, ``m`` units free and ``d`` levels of checkpoints allowed, is
    zero when the steps fit one tape, else the least over the first cut ``k``
    of ``cost(k, j, m - 1, d) + (prefix[k] - prefix[i]) + cost(i, k, m, d - 1)``
    (the segment ``i:k`` is rerun, then reversed one level down; at ``d = 0``
    only a tape is left). It is filled bottom-up, one table of every ``(i, j)``
    per ``(d, m)``, the least over ``k`` taken in one array operation; the
    first ``k`` of equal totals wins, summed in that order, as a recursion
    scanning ``k`` upwards would.

    Returns:
        A function of the memory units giving the fewest FLOPs recomputed and
        the tree that recomputes them, its cuts at step boundaries ``1 ..
        steps - 1``; ``(inf, None)`` where no tree of at most ``max_depth``
        levels fits. With ``tape`` false, the last segment of every level is
        one step and a unit is one stored state (Revolve).
    """
    tables = _ChainTables(prefix, tape, max_depth)
    steps = len(prefix) - 1

    def build(i: int, j: int, m: int, depth: int) -> Schedule:
        """The tree of steps ``i:j``: its level's cuts and its nested segments."""
        cuts, nested = set(), []
        while j - i > tables.tape_limit(m):
            k = tables.first_cut(i, j, m, depth)
            # Segment i:k is recomputed in its backward, then reversed with m units.
            if k - i > tables.tape_limit(m):
                nested.append((i, build(i, k, m, depth - 1)))
            cuts.add(k)
            i, m = k, m - 1
        return Schedule(cuts=frozenset(cuts), nested=tuple(nested))

    def tree(units: int) -> tuple[float, Schedule | None]:
        total = tables.cost(0, steps, units, max_depth) if steps >= 1 else _INF
        return (total, None) if total == _INF else (total, build(0, steps, units, max_depth))

    return tree


class _ChainTables:
    """:func:`chain_trees`' tables: per level ``d`` and units ``m``, the cost and
    first cut of every span ``i:j``, filled for ``m`` as far as asked."""

    def __init__(self, prefix: Sequence[float], tape: bool, max_depth: int) -> None:
        self.tape, self.max_depth = tape, max_depth
        n = len(prefix)
        points = np.arange(n)
        self.span = points[None, :] - points[:, None]  # j - i
        # prefix[k] - prefix[i] exactly (Python integers), then as floats: [i, k].
        self.rerun = np.array([[float(b - a) for b in prefix] for a in prefix]).reshape(n, n)
        # k strictly between i and j, as [i, k, j].
        self.between = (points[:, None, None] < points[None, :, None]) & (points[None, :, None] < points[None, None, :])
        self.costs: list[list[np.ndarray]] = [[] for _ in range(max_depth + 1)]
        self.cuts: list[list[np.ndarray]] = [[] for _ in range(max_depth + 1)]

    def tape_limit(self, m: int) -> int:
        """Steps the last segment of a level may tape with ``m`` units free."""
        return m if self.tape else 1

    def cost(self, i: int, j: int, m: int, depth: int) -> float:
        self._fill(m)
        return float(self.costs[depth][m][i, j])

    def first_cut(self, i: int, j: int, m: int, depth: int) -> int:
        self._fill(m)
        return int(self.cuts[depth][m][i, j])

    def _fill(self, units: int) -> None:
        """Fills the tables of every level for ``m`` up to ``units``."""
        for m in range(len(self.costs[0]), units + 1):
            taped = self.span <= self.tape_limit(m)
            below = np.where(taped, 0.0, _INF)  # d = 0: a tape, or nothing
            self.costs[0].append(below)
            self.cuts[0].append(np.zeros(below.shape, dtype=np.int64))
            for d in range(1, self.max_depth + 1):
                if m < 2 - (not self.tape):  # a cut needs a unit for its state, and the rest still needs a tape
                    cost, cut = below, self.cuts[0][m]
                else:
                    # [i, k, j]: the rest after cut k, plus rerunning i:k, plus reversing i:k a level down.
                    rest, first = self.costs[d][m - 1][None, :, :], self.costs[d - 1][m][:, :, None]
                    total = (rest + self.rerun[:, :, None]) + first
                    total = np.where(self.between, total, _INF)
                    cut = np.argmin(total, axis=1)  # the first k of equal totals
                    cost = np.where(taped, 0.0, np.take_along_axis(total, cut[:, None, :], axis=1)[:, 0, :])
                self.costs[d].append(cost)
                self.cuts[d].append(cut)


def _on_positions(tree: Schedule, bounds: Sequence[int]) -> Schedule:
    """A tree over step boundaries, moved onto the program's positions."""
    return Schedule(cuts=frozenset(bounds[k] for k in tree.cuts),
                    nested=tuple((bounds[i], _on_positions(inner, bounds)) for i, inner in tree.nested))


def _trees(graph: ProgramGraph, tape: bool, max_depth: int) -> Callable[[int], Schedule | None]:
    """:func:`chain_trees` on the program's chain, per number of units."""
    bounds = chain_steps(graph)
    solve = chain_trees(_step_flops(graph, bounds), tape, max_depth)

    def tree(units: int) -> Schedule | None:
        _, found = solve(units)
        return None if found is None else _on_positions(found, bounds)

    return tree


def revolve_schedule(graph: ProgramGraph, snapshots: int, max_depth: int = MAX_DEPTH) -> Schedule | None:
    """Griewank's binomial checkpointing with ``snapshots`` stored states.

    Returns:
        The nested schedule with the fewest recomputed FLOPs in which at most
        ``snapshots`` chain states are stored at any time and each backward
        step tapes one step; ``None`` when the chain cannot be reversed so.
    """
    return _trees(graph, tape=False, max_depth=max_depth)(snapshots)


def revolve_schedules(graph: ProgramGraph, max_depth: int = MAX_DEPTH) -> tuple[Schedule, ...]:
    """:func:`revolve_schedule` for every number of stored states that reverses
    the chain, distinct, fewest states first (one dynamic program for all)."""
    tree = _trees(graph, tape=False, max_depth=max_depth)
    found = {s: None for s in (tree(k) for k in range(1, len(chain_steps(graph)))) if s is not None}
    return tuple(found)


def nested_candidates(graph: ProgramGraph, max_depth: int = MAX_DEPTH) -> tuple[Schedule, ...]:
    """Every distinct nested tree of both families, from the least memory up to no nesting.

    Flat schedules are left out: CP-SAT plans those.
    """
    steps = len(chain_steps(graph)) - 1
    families = (_trees(graph, tape=False, max_depth=max_depth), _trees(graph, tape=True, max_depth=max_depth))
    out: dict[Schedule, None] = {}
    for m in range(1, steps + 1):
        for tree in families:
            schedule = tree(m)
            if schedule is not None and schedule.nested:
                out[schedule] = None
    return tuple(out)
