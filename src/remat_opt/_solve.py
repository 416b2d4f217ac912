"""Stage 4 — solve: where the segments fall and what is saved, with CP-SAT.

The model encodes :func:`remat_opt._memory.simulate` with ``planning=True``
linearly (read that module first; the tests hold the two equal, and equal to
brute force on small graphs):

* ``cut[c]``: a segment starts at candidate position ``c``.
* ``save[v]``: name node ``v`` is saved by the forward.
* ``cross[v, k]``: some cut lies between ``v`` and its ``k``-th later reader,
  so ``v`` is stored from that reader's position on (monotone in ``k``).
* ``rc[u]``: unit ``u`` is recomputed in its segment's backward. Residuals
  that are not stored force ``rc``; a recomputed unit forces its inputs.
* ``tail[c]``: no cut at or after candidate ``c``, so what follows lies in
  the last segment, which runs as written: its residuals are stored (with
  the calibrated extra) and count only at the program's end.
* Running sums with a reset at every cut give each segment's recomputed
  bytes, relayout copies and largest transient; at each possible segment
  end the peak of the segment is bounded by the budget.

The objective is the recomputed FLOPs. Unlike Checkmate's MILP (one boolean
per stage and node, O(n²)), the variables here are O(nodes + cuts), because
the execution model fixes the order: forward, then segments in reverse.

References:
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
    Rematerialization", MLSys 2020; Bartan et al., "Moccasin: Efficient Tensor
    Rematerialization for Neural Networks", ICML 2023.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from ._chen import chen_schedules
from ._errors import InfeasibleBudgetError
from ._graph import ProgramGraph
from ._memory import (
    boundary_cotangent_bytes,
    kept_buffers,
    materialized,
    read_by_backward,
    remat_bytes,
    simulate,
    tail_extra_bytes,
    transient_bytes,
)
from ._schedule import Schedule
from ._slots import gradient_slots, slot_candidates, slot_reads


@dataclass(frozen=True)
class SolverOptions:
    """CP-SAT settings; every solve is bounded, seeded and deterministic.

    Attributes:
        time_limit_s: wall-clock cap per solve, a safety net: set it well
            above what ``deterministic_time_limit`` takes, because a solve
            stopped by the wall clock depends on the machine's load.
        deterministic_time_limit: CP-SAT's deterministic-time cap (the one
            that makes a time-out repeatable).
        num_workers: parallel search workers (interleaved, deterministic).
        seed: random seed.
        max_cut_candidates: positions offered as segment starts (see
            :func:`cut_candidates`), besides the starting schedule's cuts.
        first_stage_share: the share of both limits that :func:`solve`
            spends on a first stage (what to save, with the starting
            schedule's cuts) before it searches the cuts too; 0 (the
            default) skips it. It helps on large graphs at tight budgets
            and costs elsewhere (see :func:`_saves_within_cuts`).
    """

    time_limit_s: float = 120.0
    deterministic_time_limit: float = 10.0
    num_workers: int = 8
    seed: int = 0
    max_cut_candidates: int = 48
    first_stage_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.first_stage_share < 1.0:
            raise ValueError(f"SolverOptions.first_stage_share must be in [0, 1) (0 skips the first stage); "
                             f"got {self.first_stage_share!r}.")


@dataclass(frozen=True)
class Solution:
    """A schedule with the solver's verdict."""

    schedule: Schedule
    status: str
    objective_flops: int
    bound_flops: float
    gap: float
    solve_seconds: float


def cut_candidates(graph: ProgramGraph, limit: int, include: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """Positions where a segment may start.

    Half of ``limit`` are the positions with the fewest crossing bytes; the
    other half, the narrowest position of each of ``limit / 2`` equal windows
    of the program, so that every part of a long program (every layer of an
    unrolled scan) can be cut. ``include`` (a starting schedule's cuts) is
    added, so that the start is a solution of the model.
    """
    n = graph.num_positions
    positions = range(1, n)
    if n - 1 <= limit:
        return tuple(positions)
    key = lambda c: (graph.crossing_bytes(c), c)  # noqa: E731
    chosen = set(sorted(positions, key=key)[: limit - limit // 2])
    windows = max(1, limit // 2)
    for w in range(windows):
        lo, hi = 1 + w * (n - 1) // windows, 1 + (w + 1) * (n - 1) // windows
        if lo < hi:
            chosen.add(min(range(lo, hi), key=key))
    return tuple(sorted(chosen | {c for c in include if 0 < c < n}))


def save_candidates(graph: ProgramGraph) -> tuple[int, ...]:
    """Name nodes worth saving: the backward reads them or recomputes from them."""
    out = []
    for v in range(graph.num_nodes):
        unit = graph.units[graph.node_unit[v]]
        if unit.name is None or graph.is_output[v]:
            continue
        if graph.residual[v] or any(graph.units[u].name is None for u in graph.consumers[v]):
            out.append(v)
    return tuple(out)


class _Encoding:
    """The CP-SAT model of one graph over fixed candidate sets."""

    def __init__(self, graph: ProgramGraph, cuts: tuple[int, ...], saves: tuple[int, ...]):
        self.graph = graph
        self._fenced_reads: dict[tuple[int, int], cp_model.IntVar] = {}
        m = self.model = cp_model.CpModel()
        g, units = graph, graph.units
        n = g.num_positions
        self.cut = {c: m.NewBoolVar(f"cut{c}") for c in cuts}
        self.save = {v: m.NewBoolVar(f"save{v}") for v in saves}
        cut_list = sorted(self.cut)

        def cuts_between(lo: int, hi: int) -> list:
            """Cut literals at positions in (lo, hi]."""
            return [self.cut[c] for c in cut_list if lo < c <= hi]

        # cross[v]: list of (reader position, literal) in increasing position.
        self.cross: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
        for v in range(g.num_nodes):
            if g.is_output[v]:
                continue
            p = g.position_of(v)
            readers = sorted({units[u].position for u in g.consumers[v] if units[u].position > p})
            chain, prev, prev_pos = [], None, p
            for q in readers:
                new = cuts_between(prev_pos, q)
                if not new and prev is None:
                    prev_pos = q
                    continue
                lit = m.NewBoolVar(f"x{v}_{q}")
                parts = new + ([prev] if prev is not None else [])
                m.AddMaxEquality(lit, parts)
                chain.append((q, lit))
                prev, prev_pos = lit, q
            if chain:
                self.cross[v] = chain
        crossing = {v: chain[-1][1] for v, chain in self.cross.items()}
        for v, s in self.save.items():
            if v in crossing:
                m.Add(s + crossing[v] <= 1)  # saving a value that is stored anyway only costs

        # tail[c]: no segment starts at or after candidate c, so position c - 1
        # onwards lies in the last segment (which is plain, see _memory).
        self.tail: dict[int, cp_model.IntVar] = {}
        later = None
        for c in reversed(cut_list):
            t = m.NewBoolVar(f"tail{c}")
            parts = [self.cut[c]] + ([later.Not()] if later is not None else [])
            m.AddBoolOr(parts).OnlyEnforceIf(t.Not())  # not tail => a cut at or after c
            m.AddImplication(t, self.cut[c].Not())
            if later is not None:
                m.AddImplication(t, later)
            self.tail[c] = t
            later = t

        def in_tail(p: int) -> object:
            """1 when position ``p`` lies in the last segment (a literal, or the constant 1)."""
            nxt = next((c for c in cut_list if c > p), None)
            return 1 if nxt is None else self.tail[nxt]

        self.in_tail = in_tail

        def available(v: int) -> list:
            found = [x for x in (crossing.get(v), self.save.get(v)) if x is not None]
            return found + ([in_tail(g.position_of(v))] if g.residual[v] else [])

        self.rc = {u.index: m.NewBoolVar(f"rc{u.index}") for u in units}
        for v in range(g.num_nodes):
            if g.residual[v]:
                m.Add(self.rc[g.node_unit[v]] + sum(available(v)) >= 1)
        for u in units:
            for w in u.inputs:
                m.Add(self.rc[g.node_unit[w]] + sum(available(w)) >= self.rc[u.index])

        # Schedules that save a name lose two of the planning model's terms
        # (_memory.simulate with planning=True).
        self.any_saved = None
        if self.save:
            self.any_saved = m.NewBoolVar("any_saved")
            m.AddMaxEquality(self.any_saved, list(self.save.values()))
        no_names = [self.any_saved.Not()] if self.any_saved is not None else []

        # A segment output read only by the last segment is saved by name for
        # its own segment when that segment's recomputation reads it (_memory.simulate).
        self.own_output: dict[int, cp_model.IntVar] = {}
        for v, chain in self.cross.items():
            if read_by_backward(g, v):
                continue
            fenced = [f for f in (self._crosses_before_tail(v, q, lit) for q, lit in chain) if f is not None]
            kept = m.NewBoolVar(f"own{v}")
            for u in set(g.consumers[v]):
                m.Add(kept >= self.rc[u] + chain[-1][1] - 1 - sum(fenced))
            self.own_output[v] = kept

        # Running sums over positions, reset where a segment starts.
        by_pos: list[list[int]] = [[] for _ in range(n)]
        for u in units:
            by_pos[u.position].append(u.index)
        relayout = self._relayout_terms()
        big = 2 * sum(g.node_bytes) + 1
        kept = kept_buffers(g)
        self.acc, self.tmax = [], []
        for p in range(n):
            local = sum(self.rc[u] * remat_bytes(g, u, kept) for u in by_pos[p]) + sum(relayout[p])
            t_here = max((transient_bytes(g, u) for u in by_pos[p]), default=0)
            acc = m.NewIntVar(0, big, f"acc{p}")
            tmax = m.NewIntVar(0, big, f"tmax{p}")
            m.Add(acc >= local)
            m.Add(tmax >= t_here)
            for u in by_pos[p]:
                recomputed_here = transient_bytes(g, u, recomputed=True)
                if recomputed_here > t_here:
                    m.Add(tmax >= recomputed_here).OnlyEnforceIf([self.rc[u], *no_names])
            if p > 0:
                enforce = [self.cut[p].Not()] if p in self.cut else []
                m.Add(acc >= self.acc[p - 1] + local).OnlyEnforceIf(enforce)
                m.Add(tmax >= self.tmax[p - 1]).OnlyEnforceIf(enforce)
            self.acc.append(acc)
            self.tmax.append(tmax)

        # Gradient slots, and the buffers that may sit in them (_slots.slot_credit).
        slots = gradient_slots(g)
        self.slot_candidates = slot_candidates(g, slots)
        self.slot_reads = slot_reads(slots)

        # Segment-end peaks: at e = c - 1 for each candidate c, and at the end.
        self.ends: list[tuple[int, cp_model.LinearExpr, list]] = []
        base = g.input_bytes + g.output_bytes
        for e in [c - 1 for c in cut_list] + [n - 1]:
            stored = self._stored_at(e)
            expr = base + stored + self.acc[e] + self.tmax[e] + boundary_cotangent_bytes(g, e + 1)
            enforce = [self.cut[e + 1]] if e + 1 in self.cut else []
            self.ends.append((e, expr, enforce))
        self.flops = sum(self.rc[u] * units[u].flops for u in g.primal)

    def _relayout_terms(self) -> list[list]:
        """Per position, the relayout copies its segment's backward makes
        (:func:`remat_opt._memory.relayout_bytes`, spread over reading positions)."""
        g = self.graph
        terms: list[list] = [[] for _ in range(g.num_positions)]
        if not g.transposed:
            return terms
        for v in range(g.num_nodes):
            if not g.transposed[v] or g.is_output[v]:
                continue
            if v in self.save:
                terms[g.position_of(v)].append(g.node_bytes[v] * self.save[v])
            for q, lit in self.cross.get(v, ()):
                read = self._crosses_before_tail(v, q, lit)  # v crosses into q's segment, not the last
                if read is not None:
                    terms[q].append(g.node_bytes[v] * read)
        return terms

    def _crosses_before_tail(self, v: int, q: int, lit: cp_model.IntVar) -> cp_model.IntVar | None:
        """A literal for: ``v`` crosses a cut before its reader at ``q``, and ``q``
        is not in the last segment; ``None`` when ``q`` is always in it."""
        tail = self.in_tail(q)
        if isinstance(tail, int):
            return None
        if (v, q) not in self._fenced_reads:
            both = self.model.NewBoolVar(f"fenced{v}_{q}")
            self.model.AddBoolAnd([lit, tail.Not()]).OnlyEnforceIf(both)
            self.model.AddBoolOr([lit.Not(), tail, both])
            self._fenced_reads[v, q] = both
        return self._fenced_reads[v, q]

    def _stored_at(self, e: int) -> cp_model.LinearExpr:
        """Bytes of distinct stored buffers live at the end position ``e``.

        At the program's end that includes the last segment's own residuals."""
        g = self.graph
        live: dict[int, list] = {}
        total = 0
        if e == g.num_positions - 1:
            tail_buffers = set()
            for v in range(g.num_nodes):
                if materialized(g, v) and not g.is_output[v]:  # residuals and held sources
                    lit = self.in_tail(g.position_of(v))
                    if isinstance(lit, int):
                        lit = self.model.NewConstant(1)
                    live.setdefault(g.buffer[v], []).append(lit)
                    tail_buffers.add(g.buffer[v])
            for b in sorted(tail_buffers - {-1}):  # calibrated storage of code run as written
                total += tail_extra_bytes(g, b) * self.in_tail(g.position_of(b))
        crossing: dict[int, list] = {}  # buffer -> literals: a value laid over it is stored across a cut
        for v, chain in self.cross.items():
            lits = [lit for q, lit in chain if q <= e]
            if not lits:
                continue
            if e == g.num_positions - 1 and not read_by_backward(g, v):
                # Into the last segment, which runs as written, a value the
                # backward does not read dies in the forward: it is live at the
                # end only if it crosses into a reader in a fenced segment.
                lits = [self._crosses_before_tail(v, q, lit) for q, lit in chain]
                lits = [lit for lit in lits if lit is not None]
                if not lits:
                    continue
                lit = self.model.NewBoolVar(f"kept{v}")
                self.model.AddMaxEquality(lit, lits)
                lits = [lit]
            live.setdefault(g.buffer[v], []).append(lits[-1])
            crossing.setdefault(g.buffer[v], []).append(lits[-1])
        for v, s in self.save.items():
            if g.position_of(v) <= e:
                live.setdefault(g.buffer[v], []).append(s)
        for v, kept in self.own_output.items():
            if g.position_of(v) <= e:
                live.setdefault(g.buffer[v], []).append(kept)
        for b, lits in live.items():
            if b < 0:
                continue
            if len(lits) == 1:
                lit = lits[0]
            else:
                lit = self.model.NewBoolVar(f"buf{b}_{e}")
                self.model.AddMaxEquality(lit, lits)
            total += g.node_bytes[b] * lit
        return total - self._slot_credit(e, crossing)

    def _slot_credit(self, e: int, crossing: dict[int, list]) -> cp_model.LinearExpr:
        """Stored bytes laid over free gradient slots at the end position ``e``
        (:func:`remat_opt._slots.slot_credit`).

        ``y`` marks a buffer credited: stored across a cut, in a schedule that
        saves no names.
        A buffer fits the slots of its size whose input's last reader precedes
        it; those sets are nested, so Hall's condition on each prefix (no more
        buffers up to a position than slots free before it) makes the largest
        credit equal the simulator's matching.
        """
        g, m = self.graph, self.model
        items: dict[int, list[tuple[int, object]]] = {}
        for b, position in self.slot_candidates.items():
            if b in crossing:
                y = m.NewBoolVar(f"slot{b}_{e}")
                m.Add(y <= sum(crossing[b]))
                if self.any_saved is not None:
                    m.AddImplication(y, self.any_saved.Not())
                items.setdefault(g.node_bytes[b], []).append((position, y))
        credit = 0
        for size, listed in items.items():
            reads = self.slot_reads[size]
            listed.sort(key=lambda item: item[0])
            for k, (position, _) in enumerate(listed):
                if k + 1 == len(listed) or listed[k + 1][0] != position:
                    m.Add(sum(y for _, y in listed[: k + 1]) <= bisect.bisect_left(reads, position))
            credit += size * sum(y for _, y in listed)
        return credit

    def schedule(self, solver: cp_model.CpSolver) -> Schedule:
        cuts = frozenset(c for c, x in self.cut.items() if solver.Value(x))
        saved = frozenset(v for v, x in self.save.items() if solver.Value(x))
        return Schedule(cuts=cuts, saved=saved)


def _solver(options: SolverOptions) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = options.time_limit_s
    params.max_deterministic_time = options.deterministic_time_limit
    params.num_workers = options.num_workers
    params.interleave_search = True
    params.random_seed = options.seed
    return solver


def _chen_starts(graph: ProgramGraph) -> list[Schedule]:
    """Chen's segmentations, distinct, by predicted peak (ties: by cut positions)."""
    return sorted(chen_schedules(graph), key=lambda s: (simulate(graph, s).peak_bytes, sorted(s.cuts)))


def min_peak_schedule(graph: ProgramGraph, options: SolverOptions = SolverOptions()) -> Schedule:
    """A schedule with the smallest peak the model can reach, whatever the FLOPs.

    CP-SAT starts from the best of Chen's segmentations (:mod:`remat_opt._chen`)
    and the result is never worse than any of them: under a time limit the
    search may stop before it has improved on that start.
    """
    best_start = _chen_starts(graph)[0]
    cuts = cut_candidates(graph, options.max_cut_candidates, best_start.cuts)
    enc = _Encoding(graph, cuts, save_candidates(graph))
    m = enc.model
    peak = m.NewIntVar(0, sum(graph.node_bytes) * 4 + graph.input_bytes + graph.output_bytes, "peak")
    for _, expr, enforce in enc.ends:
        m.Add(peak >= expr).OnlyEnforceIf(enforce)
    m.Minimize(peak)
    _hint(enc, best_start)
    solver = _solver(options)
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return best_start
    found = enc.schedule(solver)
    return min((found, best_start), key=lambda s: simulate(graph, s, planning=True).peak_bytes)


def low_memory_schedules(graph: ProgramGraph, lowest: Schedule, count: int) -> list[Schedule]:
    """``lowest`` and the Chen segmentations nearest to it in predicted peak, distinct.

    The model ranks them; XLA's fusion can reorder schedules whose predicted
    peaks are a few percent apart, so a caller measures them all.
    """
    ranked = [s for s in _chen_starts(graph) if s != lowest]
    return [lowest, *ranked[: max(0, count - 1)]]


def solve(graph: ProgramGraph, budget_bytes: int, options: SolverOptions = SolverOptions()) -> Solution:
    """Minimum-recompute schedule whose predicted peak fits ``budget_bytes``.

    The search starts from the cheapest of Chen's segmentations that fits
    (:func:`_incumbent`). With ``options.first_stage_share`` and a start
    that has cuts, a first stage searches only what to save within them
    (:func:`_saves_within_cuts`), then the full model searches cuts and
    saves from its result. The result is never worse than the start or
    either stage; the gap is against the full model's bound.

    Args:
        graph: the program graph.
        budget_bytes: the peak to fit, in XLA's terms (argument + output + temp).
        options: solver settings.

    Returns:
        The schedule with status ``"OPTIMAL"`` or ``"FEASIBLE"`` and the gap.

    Raises:
        InfeasibleBudgetError: no schedule fits; carries the smallest peak the
            model can reach.
    """
    start = time.perf_counter()
    incumbent = _incumbent(graph, budget_bytes)
    if incumbent is not None and incumbent.cuts and options.first_stage_share > 0:
        share = options.first_stage_share
        first = replace(options, time_limit_s=share * options.time_limit_s,
                        deterministic_time_limit=share * options.deterministic_time_limit)
        incumbent = _saves_within_cuts(graph, budget_bytes, incumbent, first)
        options = replace(options, deterministic_time_limit=(1 - share) * options.deterministic_time_limit,
                          time_limit_s=max(1.0, options.time_limit_s - (time.perf_counter() - start)))
    include = incumbent.cuts if incumbent is not None else frozenset()
    enc = _budget_model(graph, budget_bytes, cut_candidates(graph, options.max_cut_candidates, include))
    if incumbent is not None:
        _hint(enc, incumbent)
    solver = _solver(options)
    status = solver.Solve(enc.model)
    found = enc.schedule(solver) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    if found is None and incumbent is None:
        lowest = min_peak_schedule(graph, options)
        detail = "" if status == cp_model.INFEASIBLE else (
            f"CP-SAT stopped with {solver.StatusName(status)} before finding a schedule.")
        raise InfeasibleBudgetError(budget_bytes, simulate(graph, lowest, planning=True).peak_bytes, detail,
                                    schedule=lowest)
    bound = max(0.0, float(solver.BestObjectiveBound()))
    if found is None or (
        incumbent is not None
        and simulate(graph, incumbent).recompute_flops < simulate(graph, found).recompute_flops
    ):
        # The search stopped before it matched its starting point (large graphs
        # under the deterministic limit): the start is the best feasible plan.
        found, status = incumbent, cp_model.FEASIBLE
    objective = simulate(graph, found).recompute_flops
    gap = 0.0 if status == cp_model.OPTIMAL or objective == 0 else max(0.0, (objective - bound) / objective)
    return Solution(
        schedule=found,
        status=solver.StatusName(status),
        objective_flops=objective,
        bound_flops=bound,
        gap=gap,
        solve_seconds=time.perf_counter() - start,
    )


def _budget_model(graph: ProgramGraph, budget_bytes: int, cuts: tuple[int, ...]) -> _Encoding:
    """The model of :func:`solve` over cut candidates ``cuts``: least recompute within the budget."""
    enc = _Encoding(graph, cuts, save_candidates(graph))
    for _, expr, enforce in enc.ends:
        enc.model.Add(expr <= budget_bytes).OnlyEnforceIf(enforce)
    enc.model.Minimize(enc.flops)
    return enc


def _saves_within_cuts(graph: ProgramGraph, budget_bytes: int, start: Schedule, options: SolverOptions) -> Schedule:
    """The first stage of :func:`solve`: what to save, with no cut but ``start``'s.

    On large graphs the full model's search rarely gets far from its start
    in the time it has; this one, with a handful of cut candidates, gets
    further. Measured with a share of 0.4 (jax 0.10.2, 2 cores): on the zoo
    GPT's Pareto sweep (756 equations, deterministic limit 10) +9.80%
    recompute at 30.32 MiB against +12.65% for the full model alone, +1.62%
    against +1.92% at 41.90 MiB; but the ResNet at 2.86 MiB +17.23% against
    +8.74%; in ``solve_time.py``'s 60 s runs (and 8 workers, against 2 and
    one stage) the 2-layer GPT lost its proof of optimality and the 8-layer
    ended 22% higher, the 4-layer 15% lower; solves take up to twice the
    wall time. Hence off by default. Its bound holds for these
    cuts only, so :func:`solve` reports the full model's. ``start`` if
    nothing cheaper is found.
    """
    enc = _budget_model(graph, budget_bytes, tuple(sorted(start.cuts)))
    _hint(enc, start)
    solver = _solver(options)
    if solver.Solve(enc.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return start
    found = enc.schedule(solver)
    return min((start, found), key=lambda s: simulate(graph, s).recompute_flops)


def _incumbent(graph: ProgramGraph, budget_bytes: int) -> Schedule | None:
    """The cheapest of the unsegmented program and Chen's segmentations that the
    model fits in ``budget_bytes``; CP-SAT starts from it and never returns worse."""
    fitting = [s for s in (Schedule(), *_chen_starts(graph)) if simulate(graph, s).peak_bytes <= budget_bytes]
    return min(fitting, key=lambda s: (simulate(graph, s).recompute_flops, sorted(s.cuts)), default=None)


def _hint(enc: _Encoding, schedule: Schedule) -> None:
    for c, x in enc.cut.items():
        enc.model.AddHint(x, c in schedule.cuts)
    for v, x in enc.save.items():
        enc.model.AddHint(x, v in schedule.saved)
