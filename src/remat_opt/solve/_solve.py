"""Stage 4 — solve: where the segments fall and what is saved, with CP-SAT.

Searches the model of :mod:`remat_opt.solve._encoding` (the memory model of
:func:`remat_opt.memory._simulate.simulate` with ``planning=True``, linearly): the
least recompute under a budget (:func:`solve`), the lowest peak at any
cost (:func:`min_peak_schedule`), each started from the best of Chen's
segmentations (and, on a program of identical blocks, of the block
decomposition's plan, :mod:`remat_opt.solve._block_solve`) and never
returning worse. Every solve is bounded, seeded
and deterministic (:class:`SolverOptions`).

References:
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
    Rematerialization", MLSys 2020; Bartan et al., "Moccasin: Efficient Tensor
    Rematerialization for Neural Networks", ICML 2023.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from .._errors import InfeasibleBudgetError
from .._schedule import Schedule
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ._block_solve import block_start
from ._chen import chen_schedules
from ._encoding import Encoding, cut_candidates, save_candidates


WHOLE_GRAPH_POSITIONS = 300
"""Above this many positions, a program of repeated blocks takes the block
decomposition's plan without the whole-graph CP-SAT (``SolverOptions.whole_graph``
left at ``None``). The whole-graph model proves optimality up to about two zoo
GPT layers (``experiments/results/solve_time.csv``); above that, started from
the decomposition's plan, it did not improve it on the zoo GPT at 8 and 16
layers (``experiments/block_solve.py``), nor in the demo, where it took longer
for the same or a costlier plan (docs/measurements.md, "Solve time" and "The
demo")."""


@dataclass
class SolverClock:
    """Seconds spent in solvers during one planning call, whichever plan wins."""

    seconds: float = 0.0

    def add(self, seconds: float) -> float:
        """Counts ``seconds``; returns them."""
        self.seconds += seconds
        return seconds


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
        blocks: on a program made of identical blocks
            (:mod:`remat_opt.solve._blocks`), start from the plan of the block
            decomposition (:mod:`remat_opt.solve._block_solve`) when it beats
            Chen's.
        whole_graph: run the whole-graph CP-SAT model (from the best start);
            off, a program of identical blocks gets the decomposition's plan
            alone (status ``"FEASIBLE"``, no bound: gap 1), in seconds
            whatever its depth. Programs without blocks always run it.
            ``None`` (the default): on, unless the program has blocks and
            more than :data:`WHOLE_GRAPH_POSITIONS` positions.
    """

    time_limit_s: float = 120.0
    deterministic_time_limit: float = 10.0
    num_workers: int = 8
    seed: int = 0
    max_cut_candidates: int = 48
    first_stage_share: float = 0.0
    blocks: bool = True
    whole_graph: bool | None = None

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
    method: str = "cp-sat"


def _solver(options: SolverOptions) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = options.time_limit_s
    params.max_deterministic_time = options.deterministic_time_limit
    params.num_workers = options.num_workers
    params.interleave_search = True
    params.random_seed = options.seed
    return solver


logger = logging.getLogger("remat_opt")


def _run(solver: cp_model.CpSolver, model: cp_model.CpModel, options: SolverOptions
         ) -> cp_model.CpSolverStatus:
    """Solves ``model``, reporting a search the wall clock stopped.

    The deterministic limit makes a time-out repeatable; the wall-clock cap is
    a safety net. When the cap stops a search first (a loaded machine), the
    plan may differ from run to run, and the log says so.
    """
    status = solver.solve(model)
    # Short of a proof, the search stopped on a limit: if not on the deterministic
    # one, on the wall clock (whose own reading can fall a hair short of its cap).
    # (Read off the response: ortools 9.12's CpSolver has no ``deterministic_time``.)
    proved = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    if not proved and solver.response_proto.deterministic_time < options.deterministic_time_limit:
        logger.warning("CP-SAT stopped on its wall-clock cap (%.0f s) after %.1f of %.1f deterministic seconds: "
                       "this plan may differ from run to run. Raise SolverOptions.time_limit_s.",
                       options.time_limit_s, solver.response_proto.deterministic_time,
                       options.deterministic_time_limit)
    return status


def _chen_starts(graph: ProgramGraph) -> list[Schedule]:
    """Chen's segmentations, distinct, by the planning model's peak (ties: by cut positions)."""
    return sorted(chen_schedules(graph), key=lambda s: (simulate(graph, s, planning=True).peak_bytes, sorted(s.cuts)))


def min_peak_schedule(graph: ProgramGraph, options: SolverOptions = SolverOptions()) -> Schedule:
    """A schedule with the smallest peak the model can reach, whatever the FLOPs.

    CP-SAT starts from the best of Chen's segmentations (:mod:`remat_opt.solve._chen`)
    and the result is never worse than any of them: under a time limit the
    search may stop before it has improved on that start.
    """
    best_start = _chen_starts(graph)[0]
    cuts = cut_candidates(graph, options.max_cut_candidates, best_start.cuts)
    enc = Encoding(graph, cuts, save_candidates(graph))
    m = enc.model
    peak = m.new_int_var(0, sum(graph.node_bytes) * 4 + graph.input_bytes + graph.output_bytes, "peak")
    for _, expr, enforce in enc.ends:
        m.add(peak >= expr).only_enforce_if(enforce)
    m.minimize(peak)
    _hint(enc, best_start)
    solver = _solver(options)
    status = _run(solver, m, options)
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


def solve(graph: ProgramGraph, budget_bytes: int, options: SolverOptions = SolverOptions(),
          starts: Sequence[Schedule] = ()) -> Solution:
    """Minimum-recompute schedule whose predicted peak fits ``budget_bytes``.

    The search starts from the cheapest of Chen's segmentations and ``starts``
    that fits (:func:`_incumbent`), or from the block decomposition's plan when the
    program repeats a block and that plan is cheaper (``options.blocks``);
    with ``options.whole_graph`` off, that plan is the result. With ``options.first_stage_share`` and a start
    that has cuts, a first stage searches only what to save within them
    (:func:`_saves_within_cuts`), then the full model searches cuts and
    saves from its result. The result is never worse than the start or
    either stage; the gap is against the full model's bound.

    Args:
        graph: the program graph.
        budget_bytes: the peak to fit, in XLA's terms (argument + output + temp).
        options: solver settings.
        starts: schedules to start from besides Chen's, each where the model
            CP-SAT solves fits it (a plan found under an earlier, lower target).

    Returns:
        The schedule with status ``"OPTIMAL"`` or ``"FEASIBLE"`` and the gap.

    Raises:
        InfeasibleBudgetError: no schedule fits; carries the smallest peak the
            model can reach.
    """
    start = time.perf_counter()
    incumbent, decomposed = _start(graph, budget_bytes, options, starts)
    method = "blocks+cp-sat" if decomposed else "cp-sat"
    whole_graph = options.whole_graph
    if whole_graph is None:
        whole_graph = graph.num_positions <= WHOLE_GRAPH_POSITIONS
    if decomposed and not whole_graph:
        assert incumbent is not None  # the decomposition's plan, or a cheaper start
        objective = simulate(graph, incumbent).recompute_flops
        verdict, gap = ("OPTIMAL", 0.0) if objective == 0 else ("FEASIBLE", 1.0)
        return Solution(incumbent, verdict, objective, 0.0, gap, time.perf_counter() - start, "blocks")
    if incumbent is not None and incumbent.cuts and options.first_stage_share > 0:
        incumbent, options = _first_stage(graph, budget_bytes, incumbent, options, start)
    include = incumbent.cuts if incumbent is not None else frozenset()
    enc = _budget_model(graph, budget_bytes, cut_candidates(graph, options.max_cut_candidates, include))
    if incumbent is not None:
        _hint(enc, incumbent)
    solver = _solver(options)
    status = _run(solver, enc.model, options)
    found, status = _found(enc, budget_bytes, solver, status, incumbent, options)
    return _verdict(graph, found, solver, status, time.perf_counter() - start, method)


def _found(enc: Encoding, budget_bytes: int, solver: cp_model.CpSolver, status: cp_model.CpSolverStatus,
           incumbent: Schedule | None, options: SolverOptions) -> tuple[Schedule, cp_model.CpSolverStatus]:
    """The cheaper of CP-SAT's schedule (of ``enc``, on its graph) and the start, with the status to report.

    Raises:
        InfeasibleBudgetError: neither exists; with the model's lowest-memory schedule.
    """
    graph = enc.graph
    found = enc.schedule(solver) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    if found is None and incumbent is None:
        lowest = min_peak_schedule(graph, options)
        detail = "" if status == cp_model.INFEASIBLE else (
            f"CP-SAT stopped with {solver.status_name(status)} before finding a schedule.")
        raise InfeasibleBudgetError(budget_bytes, simulate(graph, lowest, planning=True).peak_bytes, detail,
                                    schedule=lowest)
    if found is None or (
        incumbent is not None
        and simulate(graph, incumbent).recompute_flops < simulate(graph, found).recompute_flops
    ):
        # The search stopped before it matched its starting point (large graphs
        # under the deterministic limit): the start is the best feasible plan.
        found, status = incumbent, cp_model.FEASIBLE
    assert found is not None  # found nothing and had no start: raised above
    return found, status


def _start(graph: ProgramGraph, budget_bytes: int, options: SolverOptions,
           starts: Sequence[Schedule]) -> tuple[Schedule | None, bool]:
    """Where :func:`solve` starts: the cheapest of Chen's segmentations and ``starts``
    that fits (:func:`_incumbent`), or the block decomposition's plan when the program
    repeats a block (``options.blocks``) and that plan is cheaper; and whether
    the program has such blocks."""
    incumbent = _incumbent(graph, budget_bytes, starts)
    decomposed = block_start(graph, budget_bytes) if options.blocks else None
    if decomposed is not None and (incumbent is None or decomposed.flops < simulate(graph, incumbent).recompute_flops):
        incumbent = decomposed.schedule
    return incumbent, decomposed is not None


def _first_stage(graph: ProgramGraph, budget_bytes: int, incumbent: Schedule, options: SolverOptions,
                 start: float) -> tuple[Schedule, SolverOptions]:
    """The first stage's result (:func:`_saves_within_cuts`, on ``options.first_stage_share``
    of both limits), and the options left for the full model after it."""
    share = options.first_stage_share
    first = replace(options, time_limit_s=share * options.time_limit_s,
                    deterministic_time_limit=share * options.deterministic_time_limit)
    incumbent = _saves_within_cuts(graph, budget_bytes, incumbent, first)
    rest = replace(options, deterministic_time_limit=(1 - share) * options.deterministic_time_limit,
                   time_limit_s=max(1.0, options.time_limit_s - (time.perf_counter() - start)))
    return incumbent, rest


def _verdict(graph: ProgramGraph, found: Schedule, solver: cp_model.CpSolver, status: cp_model.CpSolverStatus,
             seconds: float, method: str) -> Solution:
    """``found`` with the solver's status, and its gap against the full model's bound."""
    bound = max(0.0, float(solver.best_objective_bound))
    objective = simulate(graph, found).recompute_flops
    gap = 0.0 if status == cp_model.OPTIMAL or objective == 0 else max(0.0, (objective - bound) / objective)
    return Solution(
        schedule=found,
        status=solver.status_name(status),
        objective_flops=objective,
        bound_flops=bound,
        gap=gap,
        solve_seconds=seconds,
        method=method,
    )


def _budget_model(graph: ProgramGraph, budget_bytes: int, cuts: tuple[int, ...]) -> Encoding:
    """The model of :func:`solve` over cut candidates ``cuts``: least recompute within the budget."""
    enc = Encoding(graph, cuts, save_candidates(graph))
    for _, expr, enforce in enc.ends:
        enc.model.add(expr <= budget_bytes).only_enforce_if(enforce)
    enc.model.minimize(enc.flops)
    return enc


def _saves_within_cuts(graph: ProgramGraph, budget_bytes: int, start: Schedule, options: SolverOptions) -> Schedule:
    """The first stage of :func:`solve`: what to save, with no cut but ``start``'s.

    On large graphs the full model's search rarely gets far from its start
    in the time it has; this one, with a handful of cut candidates, gets
    further on the large GPT at tight budgets, but worse elsewhere and
    slower (docs/measurements.md, "The two-stage solve"). Hence off by
    default. Its bound holds for these
    cuts only, so :func:`solve` reports the full model's. ``start`` if
    nothing cheaper is found.
    """
    enc = _budget_model(graph, budget_bytes, tuple(sorted(start.cuts)))
    _hint(enc, start)
    solver = _solver(options)
    if _run(solver, enc.model, options) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return start
    found = enc.schedule(solver)
    return min((start, found), key=lambda s: simulate(graph, s).recompute_flops)


def _incumbent(graph: ProgramGraph, budget_bytes: int, starts: Sequence[Schedule] = ()) -> Schedule | None:
    """The cheapest of the unsegmented program, Chen's segmentations and ``starts``
    that CP-SAT's own model (the planning simulation) fits in ``budget_bytes``;
    CP-SAT starts from it and never returns worse. (A start the prediction fits
    but CP-SAT's model does not would be returned over CP-SAT's own schedule.)"""
    sims = {s: simulate(graph, s, planning=True) for s in (Schedule(), *_chen_starts(graph), *starts)}
    fitting = [s for s, sim in sims.items() if sim.peak_bytes <= budget_bytes]
    return min(fitting, key=lambda s: (simulate(graph, s).recompute_flops, sorted(s.cuts)), default=None)


def _hint(enc: Encoding, schedule: Schedule) -> None:
    for c, x in enc.cut.items():
        enc.model.add_hint(x, c in schedule.cuts)
    for v, x in enc.save.items():
        enc.model.add_hint(x, v in schedule.saved)
