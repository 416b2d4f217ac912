"""CP-SAT's schedule for a budget, its target steered by what XLA measures.

Every schedule CP-SAT returns is compiled and measured; XLA's figure against
the planning model's (the model the target bounds, ``simulate(planning=True)``)
is that model's error on this program, fed back into the next target. A plan
over the budget tightens the target by its overshoot (and a margin); should
the solver return that plan again (the model put it so far under the target
that the tightened one still admits it), the target goes under the model's
figure for that plan (or the target, if lower) by the overshoot and the margin. A plan that fits, recomputes something, and that
the model put above XLA's figure by more than ``relax_slack`` of the budget
loosens it by that error (but not to a target whose plan XLA put over): the
model was conservative there, and a cheaper plan may still fit. Budget left
unused by an exact prediction is not a reason: the next plan up is then over.
Once a plan fits, every re-solve starts from it, so CP-SAT returns nothing
costlier under a looser target (the search ends when it returns that plan).
The plan XLA fits with the fewest recomputed FLOPs wins.

When nothing CP-SAT returned fits, the lowest-memory schedules are measured
(:func:`lowest_memory_plan`): the model ranks them within a few percent of
each other, and XLA decides.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from . import _progress as progress
from .._budget import format_bytes
from .._errors import InfeasibleBudgetError
from .._plan import Planned, measured_flops_of
from .._schedule import Schedule, Simulation
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ..solve._solve import Solution, SolverClock, SolverOptions, low_memory_schedules, min_peak_schedule, solve
from ._search_state import Outcome

logger = logging.getLogger("remat_opt")


@dataclasses.dataclass(frozen=True)
class Steering:
    """What the steered search needs from the planner: its limits, and how a
    schedule becomes a program, a measurement and a plan.

    Attributes:
        options: CP-SAT's settings for every solve.
        max_attempts: solves at most.
        relax_slack: an over-prediction, as a share of the budget, that loosens the target.
        retry_margin: a tightened target is under by the overshoot plus 1/``retry_margin`` of the budget.
        fallback_candidates: lowest-memory schedules measured before a budget is out of reach.
        model_slack: how far over the budget the model may put a schedule still worth a compile.
        program: the function rewritten under a schedule.
        measure: XLA's peak of a function's gradient step.
        finish: the plan of a measured schedule, from its simulation, the schedule, its
            program and what it measured (an :class:`Outcome`: peak, solver status, gap,
            solve seconds, attempts; its FLOPs are counted by ``finish``).
        infeasible: the error for a budget below reach, from the lowest-memory schedule
            and its measured peak.
    """

    options: SolverOptions
    max_attempts: int
    relax_slack: float
    retry_margin: int
    fallback_candidates: int
    model_slack: float
    program: Callable[[Schedule], Callable[..., Any]]
    measure: Callable[[Callable[..., Any]], int]
    finish: Callable[[Simulation, Schedule, Callable[..., Any], Outcome], Planned]
    infeasible: Callable[[Schedule, int], InfeasibleBudgetError]


@dataclasses.dataclass
class _Search:
    """What the steered solves leave: the best fitting plan, and what the fallback needs."""

    best: Planned | None = None
    lowest: Schedule | None = None  # the solver's own lowest-memory schedule, when it found none under a target
    bound: float = 0.0
    seconds: float = 0.0
    solves: int = 0
    above_ceiling: bool = False


def steered_plan(graph: ProgramGraph, budget: int, ceiling_flops: int | None, clock: SolverClock,
                 steering: Steering) -> Planned | None:
    """CP-SAT's cheapest schedule that XLA fits in ``budget``, at most ``max_attempts`` solves.

    ``None`` when a plan of ``ceiling_flops`` already fits and the model counts
    that many or more for CP-SAT's schedule (a tightened target only costs
    more), or, for every lowest-memory schedule left to measure, that many or
    more or a peak beyond ``model_slack`` of the budget.

    Raises:
        InfeasibleBudgetError: no schedule measured fits, none fitting anywhere else yet.
    """
    search = _steer(graph, budget, ceiling_flops, clock, steering)
    if search.best is not None:
        plan, program = search.best
        return dataclasses.replace(plan, solve_seconds=search.seconds, attempts=search.solves), program
    if search.above_ceiling:
        return None
    return lowest_memory_plan(graph, budget, ceiling_flops, clock, steering, search)


@dataclasses.dataclass
class _Target:
    """The next solve's target, and what XLA's measurements of earlier plans say about it."""

    value: int
    best: int = 0  # the target of the fitting plan in hand
    over: int | None = None  # the least target whose plan XLA put over
    # per plan XLA put over: its prediction, and its overshoot plus the margin
    below: dict[Schedule, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def under_prediction(self, schedule: Schedule) -> bool:
        """For a plan XLA put over, returned again (the planning model put it so far
        under the target that tightening did not exclude it): the target goes under
        that model's figure for it (or under the target, if lower) by the overshoot
        and margin. False for any other plan."""
        if schedule not in self.below:
            return False
        predicted, step = self.below[schedule]
        self.value = min(predicted, self.value) - step
        return True

    def tighten(self, schedule: Schedule, predicted: int, step: int, fitting: bool) -> None:
        """Under the target by ``step``, after XLA put ``schedule`` over; with a plan
        ``fitting`` already, no lower than halfway to that plan's target."""
        self.over = self.value if self.over is None else min(self.over, self.value)
        self.below[schedule] = predicted, step
        self.value -= step
        if fitting:
            self.value = max(self.value, (self.best + self.over) // 2)

    def loosen(self, error: int) -> None:
        """Over the target by the model's over-prediction ``error``, but no higher
        than halfway to the least target XLA put a plan over."""
        self.value += error
        if self.over is not None:
            self.value = min(self.value, (self.best + self.over) // 2)


def _steer(graph: ProgramGraph, budget: int, ceiling_flops: int | None, clock: SolverClock,
           steering: Steering) -> _Search:
    """Solves under a target that XLA's measurements move, as the module says."""
    search, target = _Search(), _Target(budget)
    seen: set[Schedule] = set()
    for attempt in range(1, steering.max_attempts + 1):
        progress.stage("CP-SAT solve", attempt, steering.max_attempts)
        search.solves = attempt
        solution = _solved(graph, target.value, clock, steering, search)
        if solution is None:
            break  # nothing under the target in the model: XLA may still take the lowest-memory schedule
        if ceiling_flops is not None and solution.objective_flops >= ceiling_flops:
            search.above_ceiling = True
            break
        if solution.schedule in seen:
            if search.best is not None or not target.under_prediction(solution.schedule):
                break  # the target moved, the plan did not
            continue
        seen.add(solution.schedule)
        if not _measured(graph, budget, solution, target, steering, search):
            break
    return search


def _solved(graph: ProgramGraph, target: int, clock: SolverClock, steering: Steering,
            search: _Search) -> Solution | None:
    """CP-SAT's schedule under ``target``, its time and bound counted in ``search``; ``None``
    when the model has none (``search.lowest``: the lowest-memory schedule it found)."""
    started = time.perf_counter()
    # CP-SAT starts from the plan in hand where its model fits it (a loosened target
    # does): a re-solve never returns a costlier plan than one XLA already fits.
    starts = () if search.best is None or search.best[0].schedule is None else (search.best[0].schedule,)
    try:
        solution = solve(graph, target, steering.options, starts)
    except InfeasibleBudgetError as err:
        search.seconds += clock.add(time.perf_counter() - started)  # the lowest-memory search, inside
        search.lowest = err.schedule
        return None
    search.seconds += clock.add(solution.solve_seconds)
    search.bound = search.bound or solution.bound_flops
    logger.info("solve %d/%d: target %s, %s in %.1fs, %s FLOPs recomputed (bound %.0f)", search.solves,
                steering.max_attempts, format_bytes(target), solution.status, solution.solve_seconds,
                f"{solution.objective_flops:,}", solution.bound_flops)
    return solution


def _measured(graph: ProgramGraph, budget: int, solution: Solution, target: _Target, steering: Steering,
              search: _Search) -> bool:
    """Measures CP-SAT's schedule on XLA, keeps it in ``search`` if it is the cheapest
    that fits, and moves ``target`` by XLA's figure; False when the search ends."""
    program = steering.program(solution.schedule)
    sim = simulate(graph, solution.schedule)
    planned = simulate(graph, solution.schedule, planning=True).peak_bytes  # the target bounds this model
    measured = steering.measure(program)
    logger.info("measured on XLA: %s against a budget of %s (predicted %s)", format_bytes(measured),
                format_bytes(budget), format_bytes(sim.peak_bytes))
    if measured > budget:
        # Tightened by the overshoot and a margin: a plan the model misjudges by a
        # percent or two would otherwise cost every attempt, each just over.
        step = measured - budget + budget // steering.retry_margin
        target.tighten(solution.schedule, planned, step, fitting=search.best is not None)
        return True
    plan = steering.finish(sim, solution.schedule, program,
                           Outcome(measured, None, solution.status, solution.gap, search.seconds, search.solves))
    if search.best is None or measured_flops_of(plan[0]) < measured_flops_of(search.best[0]):
        search.best, target.best = plan, target.value
    over_predicted = planned - measured  # the planning model's error on this program, here
    if solution.objective_flops == 0 or over_predicted <= budget * steering.relax_slack:
        return False
    target.loosen(over_predicted)
    return True


def lowest_memory_plan(graph: ProgramGraph, budget: int, ceiling_flops: int | None, clock: SolverClock,
                       steering: Steering, search: _Search) -> Planned | None:
    """The cheapest of the lowest-memory schedules that XLA fits, after CP-SAT's did not.

    It recomputes more than needed, and its gap against the solver's bound
    says by how much. With a plan of ``ceiling_flops`` already fitting, only a
    cheaper schedule within ``model_slack`` of the budget is compiled, and
    ``None`` is returned when there is none.

    Raises:
        InfeasibleBudgetError: XLA fits none of them; it names the lowest measured.
    """
    lowest = search.lowest
    if lowest is None:
        started = time.perf_counter()
        lowest = min_peak_schedule(graph, steering.options)
        search.seconds += clock.add(time.perf_counter() - started)
    sims = {c: simulate(graph, c) for c in low_memory_schedules(graph, lowest, steering.fallback_candidates)}
    flops = {c: sim.recompute_flops for c, sim in sims.items()}
    if ceiling_flops is not None:  # a plan fits: only a cheaper one within the model's slack is worth a compile
        slack = budget * (1 + steering.model_slack)
        flops = {c: f for c, f in flops.items() if f < ceiling_flops and sims[c].peak_bytes <= slack}
        if not flops:
            return None
    tried = []
    for k, (candidate, candidate_flops) in enumerate(flops.items(), 1):
        progress.stage("lowest-memory schedule", k, len(flops))
        program = steering.program(candidate)
        tried.append((steering.measure(program), candidate_flops, candidate, program))
        logger.info("lowest-memory schedule %d/%d: measured %s, predicted %s", k, len(flops),
                    format_bytes(tried[-1][0]), format_bytes(sims[candidate].peak_bytes))
    fitting = [t for t in tried if t[0] <= budget]
    if not fitting:
        measured, _, schedule, _ = min(tried, key=lambda t: t[:2])
        raise steering.infeasible(schedule, measured)
    measured, _, schedule, program = min(fitting, key=lambda t: t[1])
    sim = simulate(graph, schedule)
    gap = max(0.0, (sim.recompute_flops - search.bound) / sim.recompute_flops) if sim.recompute_flops else 0.0
    return steering.finish(sim, schedule, program,
                           Outcome(measured, None, "FEASIBLE", gap, search.seconds, search.solves + 1))
