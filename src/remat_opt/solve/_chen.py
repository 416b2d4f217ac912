"""Chen et al.'s segmentations as schedules on the program graph.

Used as baselines (:mod:`remat_opt.baselines._baselines`) and as starting points of the
solver's lowest-memory search (:mod:`remat_opt.solve._solve`): they cost nothing to
build and are often close to the smallest peak.

References:
    T. Chen, B. Xu, C. Zhang, C. Guestrin. Training Deep Nets with Sublinear
    Memory Cost. arXiv:1604.06174, 2016.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..memory._fusion import materialized
from ..program._graph import ProgramGraph, per_graph
from .._schedule import Schedule


def articulation_positions(graph: ProgramGraph) -> tuple[int, ...]:
    """Positions crossed by exactly one value: the graph's articulation points.

    A cut there stores a single tensor (Checkmate's ``articulation_points``,
    which its Chen baselines cut at). Program inputs are not counted: they are
    live throughout anyway.
    """
    n = graph.num_positions
    delta = [0] * (n + 1)
    for v, readers in enumerate(graph.consumers):
        p = graph.position_of(v)
        last = max((graph.units[u].position for u in readers), default=p)
        if last > p:
            delta[p + 1] += 1
            delta[last + 1] -= 1
    out, running = [], 0
    for c in range(n):
        running += delta[c]
        if c > 0 and running == 1:
            out.append(c)
    return tuple(out)


def chen_sqrt_n_schedule(graph: ProgramGraph, num_segments: int | None = None) -> Schedule:
    """Chen et al.'s sqrt(n) segments, with each cut at the narrowest nearby position.

    The program's ``n`` primal equations are split into ``k`` segments
    (``round(sqrt(n))`` by default). For each evenly spaced point ``i * n / k``
    the cut goes to the position with the fewest crossing bytes within half a
    segment of it (ties: the nearest). No value is saved by name: a segment's
    backward recomputes it from its stored inputs.

    Args:
        graph: the program graph.
        num_segments: ``k``; ``None`` for ``round(sqrt(n))``.

    Returns:
        The schedule (``k - 1`` cuts at most; fewer when windows agree).

    References:
        T. Chen, B. Xu, C. Zhang, C. Guestrin. Training Deep Nets with Sublinear
        Memory Cost. arXiv:1604.06174, 2016 (the sqrt(n) strategy).
    """
    n = graph.num_positions
    k = max(1, round(math.sqrt(n))) if num_segments is None else min(num_segments, max(1, n))
    half = n / (2 * k)
    cuts = set()
    for i in range(1, k):
        target = i * n / k
        lo, hi = max(1, math.ceil(target - half)), min(n - 1, math.floor(target + half))
        window = range(lo, hi + 1)
        if window:
            cuts.add(min(window, key=lambda c: (graph.crossing_bytes(c), abs(c - target))))
    return Schedule(cuts=frozenset(cuts))


def residual_bytes_by_position(graph: ProgramGraph) -> tuple[int, ...]:
    """Per position, bytes of the residuals made there that get a buffer of their own (not
    a view of a program input: a weight cast to another type in a ``shard_map``)."""
    out = [0] * graph.num_positions
    for v in range(graph.num_nodes):
        if materialized(graph, v) and not graph.is_output[v] and graph.buffer[v] != -1:
            out[graph.position_of(v)] += graph.node_bytes[v]
    return tuple(out)


def chen_greedy_schedule(graph: ProgramGraph, threshold_bytes: int, late: bool = False) -> Schedule:
    """Chen et al.'s greedy segmentation for one segment budget.

    Walks the positions in program order summing the residual bytes each one
    makes; at an articulation position (:func:`articulation_positions`), once
    the sum exceeds ``threshold_bytes``, a new segment starts and the sum
    restarts. Falls back to every position as a candidate when the program
    has fewer than one articulation point.

    With ``late``, of consecutive candidates with no residual made between
    them, the cut takes the last: the segment it ends then keeps the
    equations that make none. In a residual stream written per device, a
    block's projection summed across devices (``psum``) before the residual
    add makes none: cut before it, the next segment computes it again, and
    sums again, to rebuild the stream. Chen et al. do not say which of such
    cuts they take; the baselines take the first.

    Args:
        graph: the program graph.
        threshold_bytes: the per-segment budget ``B``.
        late: take the last of each run of candidates instead of the first.

    Returns:
        The schedule (no value saved by name).

    References:
        T. Chen, B. Xu, C. Zhang, C. Guestrin. Training Deep Nets with Sublinear
        Memory Cost. arXiv:1604.06174, 2016 (greedy planning with a budget).
    """
    candidates = _cut_candidates(articulation_positions(graph), graph.num_positions)
    return _greedy(graph.num_positions, candidates, residual_bytes_by_position(graph), threshold_bytes, late)


def _cut_candidates(points: Sequence[int], positions: int) -> set[int]:
    """Where the greedy may cut: the articulation ``points``, or, in a program
    without any, every position but the first."""
    return set(points) or set(range(1, positions))


def _greedy(positions: int, candidates: set[int], produced: Sequence[int], threshold_bytes: int,
            late: bool) -> Schedule:
    """:func:`chen_greedy_schedule` on the program's cut ``candidates`` and the residual
    bytes ``produced`` at each position, read off the graph once for a whole grid."""
    cuts, temp, due = set(), 0, None  # due: the cut chosen, not yet placed (late)
    for p in range(positions):
        if p in candidates and (temp > threshold_bytes or (late and due is not None)):
            due, temp = p, 0
        if due is not None and (produced[p] or not late):
            cuts.add(due)
            due = None
        temp += produced[p]
    return Schedule(cuts=frozenset(cuts | ({due} if due is not None else set())))


def chen_greedy_candidates(graph: ProgramGraph, late: bool = False) -> tuple[tuple[int, Schedule], ...]:
    """Distinct greedy schedules over the threshold grid ``B = total / m``.

    ``total`` is all residual bytes and ``m`` runs from 1 to ``2a + 2`` for
    ``a`` articulation points: from one segment (nothing stored) to segments
    shorter than the average gap between articulation points. Chen et al.
    also search for ``B``; they fix no grid.

    Returns:
        ``(threshold_bytes, schedule)`` pairs, one per distinct schedule.
    """
    produced = residual_bytes_by_position(graph)
    total = sum(produced)
    points = articulation_positions(graph)
    count = len(points) or graph.num_positions
    candidates = _cut_candidates(points, graph.num_positions)
    seen: dict[Schedule, int] = {}
    for m in range(1, 2 * count + 3):
        threshold = total // m
        schedule = _greedy(graph.num_positions, candidates, produced, threshold, late)
        seen.setdefault(schedule, threshold)
    return tuple((b, s) for s, b in seen.items())


def chen_schedules(graph: ProgramGraph) -> tuple[Schedule, ...]:
    """Chen's sqrt(n) schedule and every distinct greedy one, each run of cuts
    taken first and last: the segmentations the solver starts from and
    ``optimize`` measures beside its own plans (worked out once per graph)."""
    return per_graph(_chen_schedules, graph, lambda: _distinct_chen(graph))


_chen_schedules: dict[int, tuple[Schedule, ...]] = {}


def _distinct_chen(graph: ProgramGraph) -> tuple[Schedule, ...]:
    found = {chen_sqrt_n_schedule(graph): None}
    found.update({s: None for _, s in chen_greedy_candidates(graph)})
    found.update({s: None for _, s in chen_greedy_candidates(graph, late=True)})
    return tuple(found)
