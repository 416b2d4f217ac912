"""Keep-set schedules: a fenced segment per matmul, a chosen subset of the matmuls' outputs saved.

The plans a careful user writes by hand for a stack of matmuls: each matmul
(with what leads to it) in a fenced segment of its own, some of the matmuls'
outputs kept, everything else recomputed in its segment's backward. Which
outputs to keep is a knapsack (keep the matmuls that cost the most per byte,
up to the budget), and of two outputs of equal size the cheaper one is the one
to recompute. CP-SAT's planning model is conservative on heavily segmented
plans, so it can pass over a keep-set that XLA fits; these candidates put every
keep-set of a small program (and, on a larger one, the keep-sets that keep
the matmuls costing most per byte) beside Chen's segmentations in the
schedules the planner ranks and measures (:mod:`remat_opt.solve._outside`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from .._schedule import Schedule
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ..program._names import parse_value_name
from ._policy_saves import dot_names

ALL_SUBSETS = 8
"""Up to this many matmuls, every subset of their outputs is a candidate (2**8 = 256) on
every per-matmul segmentation; above it, on one segmentation (the fewest bytes crossing,
late), the subsets that keep the matmuls costing most FLOPs per byte, in :data:`LARGE_SIZES`
steps from none to all: the planner simulates every candidate, which on a large program
costs planning time (docs/measurements.md, "Keep-set plans")."""
LARGE_SIZES = 4


def keep_set_schedules(graph: ProgramGraph) -> tuple[Schedule, ...]:
    """Every per-matmul segmentation with every keep-set (:data:`ALL_SUBSETS`), distinct, in order."""
    dots = _dots(graph)
    if len(dots) < 2:
        return ()
    segmentations = per_matmul_cuts(graph, [p for p, _ in dots])
    names = [v for _, v in dots]
    if len(names) <= ALL_SUBSETS:
        subsets = [frozenset(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r)]
    else:
        ranked = sorted(names, key=lambda v: (-_dot_flops(graph, v) / max(1, graph.node_bytes[v]), v))
        sizes = sorted({round(i * len(ranked) / LARGE_SIZES) for i in range(LARGE_SIZES + 1)})
        subsets = [frozenset(ranked[:r]) for r in sizes]
        segmentations = segmentations[-1:]
    found: dict[Schedule, None] = {}
    for cuts in segmentations:
        for saved in subsets:
            found[Schedule(cuts=cuts, saved=saved)] = None
    return tuple(found)


def _dots(graph: ProgramGraph) -> list[tuple[int, int]]:
    """``(position, name node)`` of every matmul output the planner can save, in program order."""
    out = []
    for v in dot_names(graph):
        parsed = parse_value_name(graph.units[graph.node_unit[v]].name or "")
        if parsed is not None:
            out.append((parsed[0], v))
    return sorted(out)


def _dot_flops(graph: ProgramGraph, name_node: int) -> int:
    """FLOPs of the matmul whose output ``name_node`` names."""
    unit = graph.units[graph.node_unit[name_node]]
    return sum(graph.units[graph.node_unit[v]].flops for v in unit.inputs)


def per_matmul_cuts(graph: ProgramGraph, positions: list[int]) -> tuple[frozenset[int], ...]:
    """Segmentations with a segment per matmul: between consecutive matmuls, and after the
    last (the rest runs as written), one cut each, taken four ways: right after the matmul,
    after the equation that follows it (a layer's activation), and the first and the last
    position where the fewest bytes cross."""
    n = graph.num_positions
    ways: list[set[int]] = [set(), set(), set(), set()]
    for lo, hi in [*zip(positions, positions[1:]), (positions[-1], n - 1)]:
        span = range(lo + 1, hi + 1)
        if not span:
            continue
        least = min(graph.crossing_bytes(c) for c in span)
        ties = [c for c in span if graph.crossing_bytes(c) == least]
        for way, cut in zip(ways, (lo + 1, min(lo + 2, hi), ties[0], ties[-1])):
            way.add(cut)
    return tuple(dict.fromkeys(frozenset(s) for s in ways if s))


def measured_keep_set(graph: ProgramGraph, budget: int, measure: Callable[[Schedule], int],
                      exhaustive: bool = False) -> tuple[Schedule, int] | None:
    """A keep-set XLA fits in ``budget``, found by measuring, with its peak; ``None`` if none
    is (or the program has more than :data:`ALL_SUBSETS` matmuls, or fewer than two).

    Where the model misjudges a structure (parallel branches: it put keep-sets far under
    XLA; docs/design.md, section 7), ranking by its peak measures the wrong ones. Measured
    instead: each per-matmul segmentation keeping nothing; on the lowest, a greedy knapsack
    on XLA's figures (the outputs of the most FLOPs per byte first, each kept if XLA still
    fits; until one fits, each kept if it lowers XLA's peak, which keeping an output can:
    XLA's peak is not monotone in the kept set); then up to :data:`SECOND_LOOK` keep-sets
    the model puts cheaper, on any segmentation that fits keeping nothing (or the lowest),
    the cheapest first, each once (segmentations that differ only by where an elementwise
    equation falls mostly measure alike: a look each would spend the looks on twins; the first
    on the twin whose peak, corrected by the model's mean error there, is lowest): first those
    whose peak, corrected by the model's least error on the keep-sets measured, is over by no
    more than :data:`SECOND_LOOK_SLACK`, then, with the looks left, the others (:func:`_looks`).
    With ``exhaustive``
    (nothing else fits: the alternative is a refusal), if none of these fits, the other
    keep-sets of the lowest segmentation, the fewest FLOPs first, up to :data:`EXHAUSTIVE`.
    At most ``4 + ALL_SUBSETS + SECOND_LOOK`` compiles (and :data:`EXHAUSTIVE` more).
    """
    dots = _dots(graph)
    if not 2 <= len(dots) <= ALL_SUBSETS:
        return None
    bare = sorted((measure(Schedule(cuts=cuts)), sorted(cuts), cuts)
                  for cuts in per_matmul_cuts(graph, [p for p, _ in dots]))
    # The lowest, and every other that fits: keeping an output can lower XLA's peak below keeping none.
    looked = [b for b in bare if b is bare[0] or b[0] <= budget]
    errors = {cuts: [peak - simulate(graph, Schedule(cuts=cuts)).peak_bytes] for peak, _, cuts in looked}
    peak, _, cuts = bare[0]
    best = (Schedule(cuts=cuts), peak) if peak <= budget else None
    chosen: frozenset[int] = frozenset()  # the greedy's set, and XLA's peak of it
    chosen_peak = peak
    items = sorted((v for _, v in dots), key=lambda v: (-_dot_flops(graph, v) / max(1, graph.node_bytes[v]),
                                                          -graph.node_bytes[v], v))
    measured = {Schedule(cuts=c) for _, _, c in bare}
    for v in items:
        trial = Schedule(cuts=cuts, saved=chosen | {v})
        peak = measure(trial)
        measured.add(trial)
        errors[cuts].append(peak - simulate(graph, trial).peak_bytes)
        if peak <= budget:
            best = (trial, peak)
        if peak <= budget or (best is None and peak < chosen_peak):
            chosen, chosen_peak = trial.saved, peak
    # The second look: on every segmentation that fits keeping nothing, and the lowest.
    names = [v for _, v in dots]
    least = min(e for es in errors.values() for e in es)  # the model's most generous error here
    offsets = {c: sum(es) / len(es) for c, es in errors.items()}
    ranked = _likeliest_first(_second_look(graph, list(errors), names, measured), offsets)
    ceiling = simulate(graph, best[0]).recompute_flops if best is not None else None
    best = _looks(ranked, budget, measure, (best, ceiling), least, measured)
    if best is None and exhaustive:
        return _first_fitting(graph, budget, measure, bare[0][2], names, measured)
    return best


def _looks(ranked: list[tuple[int, Schedule, int]], budget: int, measure: Callable[[Schedule], int],
           incumbent: tuple[tuple[Schedule, int] | None, int | None], least: int,
           measured: set[Schedule]) -> tuple[Schedule, int] | None:
    """The second look's measurements: of ``ranked`` (the fewest FLOPs first), those cheaper than
    ``incumbent`` (the best fit so far and its FLOPs), at most :data:`SECOND_LOOK`: first those
    whose peak, corrected by ``least`` (the model's most generous error measured), is within
    :data:`SECOND_LOOK_SLACK` of the budget, then, with the looks left, those it rules out (the
    model errs on some keep-sets by more than on any measured). In each group, each keep-set
    once first (segmentations that differ only by where an elementwise equation falls mostly
    measure alike: a look each would spend the looks on twins), then its twins (XLA can fit a
    keep-set on one and not on its twin); each pass until one fits. The cheapest fit found, or
    the incumbent's."""
    best, ceiling = incumbent
    ruled_out = [r[2] + least > budget * (1 + SECOND_LOOK_SLACK) for r in ranked]
    likely = [r for r, out in zip(ranked, ruled_out) if not out]
    unlikely = [r for r, out in zip(ranked, ruled_out) if out]
    looks = SECOND_LOOK
    looked = {s.saved for s in measured if s.saved}
    for group, once in ((likely, True), (likely, False), (unlikely, True), (unlikely, False)):
        for flops, s, _ in group:
            if looks == 0 or (ceiling is not None and flops >= ceiling):
                break
            if s in measured or (once and s.saved in looked):
                continue
            looks -= 1
            looked.add(s.saved)
            peak = measure(s)
            measured.add(s)
            if peak <= budget:
                best, ceiling = (s, peak), flops
                break
    return best


def _second_look(graph: ProgramGraph, segmentations: list[frozenset[int]], names: list[int],
                 measured: set[Schedule]) -> list[tuple[int, Schedule, int]]:
    """``(recomputed FLOPs, schedule, predicted peak)`` of every keep-set on every one of
    ``segmentations`` not yet ``measured``, the fewest FLOPs first."""
    ranked = []
    for cuts in segmentations:
        for r in range(len(names) + 1):
            for kept in itertools.combinations(names, r):
                s = Schedule(cuts=cuts, saved=frozenset(kept))
                if s not in measured:
                    sim = simulate(graph, s)
                    ranked.append((sim.recompute_flops, len(kept), sorted(cuts), sorted(kept), sim.peak_bytes, s))
    return [(flops, s, predicted) for flops, *_, predicted, s in sorted(ranked, key=lambda r: r[:4])]


def _likeliest_first(ranked: list[tuple[int, Schedule, int]], offsets: dict[frozenset[int], float]
                     ) -> list[tuple[int, Schedule, int]]:
    """``ranked`` (the fewest FLOPs first) with each keep-set's twins (the same outputs kept, as many
    FLOPs recomputed, on other segmentations) in the places they hold, the one the model puts
    lowest first, its peak corrected by ``offsets`` (per segmentation, the model's mean error on
    the keep-sets measured there)."""
    places: dict[tuple[int, frozenset[int]], list[int]] = {}
    for k, (flops, schedule, _) in enumerate(ranked):
        places.setdefault((flops, schedule.saved), []).append(k)
    out = list(ranked)
    for at in places.values():
        for k, r in zip(at, sorted((ranked[k] for k in at), key=lambda r: r[2] + offsets[r[1].cuts])):
            out[k] = r
    return out


def _first_fitting(graph: ProgramGraph, budget: int, measure: Callable[[Schedule], int], cuts: frozenset[int],
                   names: list[int], measured: set[Schedule]) -> tuple[Schedule, int] | None:
    """The keep-set on ``cuts`` with the fewest recomputed FLOPs (the model's count) that XLA fits,
    of those not ``measured``, up to :data:`EXHAUSTIVE` measured; ``None`` if none does."""
    rest = [Schedule(cuts=cuts, saved=frozenset(kept)) for r in range(len(names) + 1)
            for kept in itertools.combinations(names, r)]
    ranked = sorted((simulate(graph, s).recompute_flops, sorted(s.saved), s) for s in rest if s not in measured)
    for *_, s in ranked[:EXHAUSTIVE]:
        peak = measure(s)
        if peak <= budget:
            return s, peak
    return None


SECOND_LOOK = 8
"""Keep-sets the model puts cheaper than the greedy knapsack's, measured at most (a compile each
of a program of at most :data:`ALL_SUBSETS` matmuls)."""

EXHAUSTIVE = 32
"""Keep-sets measured at most, the fewest FLOPs first, before a budget nothing else fits is refused:
every one of a program of five matmuls."""

SECOND_LOOK_SLACK = 0.05
"""How far over the budget a second look's corrected prediction may be: XLA's peak differs
from keep-set to keep-set by more than the model's error on the ones measured."""
