"""The FLOP search: the plan that fits with the fewest recomputed FLOPs, of every strategy XLA measured.

Each :data:`Strategy` (CP-SAT's schedules steered by XLA, loop plans, the schedules outside
CP-SAT's search, keep-sets, the program's front, JAX's policies per layer and around the whole
function) is given the plan that fits with the fewest FLOPs so far and returns one to take its
place, or ``None``; :class:`FlopSearch` runs them in turn (:meth:`FlopSearch._search`). The
planner's function (:class:`remat_opt.planner._optimize.OptimizedFunction`) is one, with its
``fn`` and ``options``; it traces and models the program, verifies the winner as ``jit``
compiles it and caches it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import jax

from .._budget import format_bytes
from ..cache._cache import cache_directory, names_cost_model, qualified_name
from ..cache._call import Call
from ..cache._counted import counted_flops
from .._errors import InfeasibleBudgetError
from ..cache import _front
from ._loop_planning import LoopSearch, body_plans, loop_plans
from ..cache._lowest import recall
from . import _progress as progress
from .._options import PlanOptions
from .._plan import Plan, Planned, annotate, measured_flops_of, measured_peak_of
from ._policy_planning import (PolicyCandidate, counted_policies, measured_policies, unmeasured_policies,
                               within_reach)
from ._refusal import nothing_fits
from .._schedule import Schedule, Simulation
from ._search_state import Measure, Modelled, Outcome, Search
from ._steering import Steering, steered_plan
from ._layer_policies import cheapest_fitting, counted_layer_policies
from ..memory._measure import gradient_flops
from ..memory._once import once_values
from ..memory._pipeline import program_model
from ..memory._sharded import is_sharded
from ..memory._calibrate import calibrate
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ..rewrite._apply import apply_schedule
from ..solve._keep_sets import measured_keep_set
from ..solve._outside import outside_tiers
from ..solve._solve import SolverClock

logger = logging.getLogger("remat_opt")


class FlopSearch:
    """The FLOP search's strategies and limits, over ``fn`` planned as ``options`` ask (set by
    the subclass, :class:`remat_opt.planner._optimize.OptimizedFunction`)."""

    fn: Callable[..., Any]
    options: PlanOptions

    FALLBACK_CANDIDATES = 4
    """Lowest-memory schedules measured on XLA before a budget is declared out of reach."""

    def _search(self, call: Call, model: Modelled, measure: Measure) -> Planned:
        """The plan that fits with the fewest recomputed FLOPs, of all strategies measured."""
        baseline_flops = step_flops(call, self.fn)
        progress.stage("measuring the plain step")
        graph, whole_graph, plain_peak = self._calibrated(call, model, measure)
        run = Search(call, model, graph, whole_graph, measure, baseline_flops, plain_peak)
        budget = call.budget
        if budget >= plain_peak:  # fn runs as written, loops and all: model that program
            sim = simulate(whole_graph, Schedule(plain=True))
            return self._plan(run, whole_graph, sim, Schedule(plain=True),
                              Outcome(plain_peak, 0, "PLAIN", 0.0, 0.0, 0)), self.fn
        # jax.checkpoint around fn with a built-in policy that recomputes nothing:
        # when XLA fits it (it can keep less than fn as written), nothing beats it.
        progress.stage("JAX's policies")
        attempts = run.attempts
        attempts.policies = counted_policies(call, baseline_flops, _count_key(run))
        attempts.measured_policies = measured_policies(attempts.policies, budget, measure, below_flops=1)
        if attempts.measured_policies and attempts.measured_policies[-1].measured <= budget:
            return self._policy_plan(run, attempts.measured_policies[-1], 0.0)
        # Each strategy in turn, given the plan that fits with the fewest FLOPs so far, returns
        # one to take its place (cheaper; or as cheap, where it wins a tie) or None.
        best: Planned | None = None
        for strategy in self._strategies():
            best = strategy(run, best) or best
        if best is not None:
            return dataclasses.replace(best[0], solve_seconds=attempts.solve_seconds), best[1]
        known = self._recalled(run)
        if known is not None:
            return known
        attempts.measured_policies += unmeasured_policies(attempts.policies, attempts.measured_policies, budget, measure)
        if attempts.measured_policies and attempts.measured_policies[-1].measured <= budget:
            return self._policy_plan(run, attempts.measured_policies[-1], attempts.solve_seconds)
        raise nothing_fits(run, self.fn)

    def _strategies(self) -> tuple[Strategy, ...]:
        """The strategies of a search, in the order they run: a tie goes to the earlier one,
        except that CP-SAT's schedule and then the other schedules win a tie with a loop plan
        (a schedule as cheap as the best loop plan is taken); a whole-function policy is
        measured only where it recomputes less than every plan before it."""
        return (self._loop_plan, self._cp_sat_plan, self._measured_schedules, self._keep_set_plan,
                self._from_front, self._layer_policy_plan, self._whole_policy_plan)

    def _cp_sat_plan(self, run: Search, best: Planned | None) -> Planned | None:
        """CP-SAT's cheapest schedule that XLA fits, steered by XLA (:mod:`remat_opt.planner._steering`),
        if it recomputes no more than ``best`` (a loop plan); its refusal is kept for the error."""
        ceiling = None if best is None else measured_flops_of(best[0]) + 1  # as cheap as the loop plan wins
        clock = SolverClock()
        try:
            planned = steered_plan(run.graph, run.call.budget, ceiling, clock, self._steering(run))
        except InfeasibleBudgetError as err:
            planned, run.attempts.infeasible = None, err
        run.attempts.solve_seconds += clock.seconds
        if planned is None or (best is not None and measured_flops_of(planned[0]) > measured_flops_of(best[0])):
            return None
        return planned

    def _whole_policy_plan(self, run: Search, best: Planned | None) -> Planned | None:
        """The whole-function policy XLA fits (:mod:`remat_opt.planner._policy_planning`), measured
        only if it recomputes fewer FLOPs than ``best`` and the model puts it within reach."""
        ceiling = None if best is None else measured_flops_of(best[0])
        found = measured_policies(run.attempts.policies, run.call.budget, run.measure, below_flops=ceiling,
                                  above_flops=0,
                                  admit=lambda p: within_reach(run.whole_graph, p, run.call.budget, self.MODEL_SLACK))
        run.attempts.measured_policies += found
        return self._policy_plan(run, found[-1], 0.0) if found and found[-1].measured <= run.call.budget else None

    def _layer_policy_plan(self, run: Search, best: Planned | None) -> Planned | None:
        """The fenced per-layer built-in policy that XLA fits with the fewest FLOPs, if it recomputes
        fewer than ``best``; the model does not describe its program (no prediction). Not on
        a mesh: its count on the jaxpr prices no recomputed collective, as the planner's plans are."""
        call = run.call
        if is_sharded(call.args, call.kwargs):
            return None
        progress.stage("per-layer policies")
        counted = counted_layer_policies(call, run.model.whole, run.baseline_flops)
        found = cheapest_fitting(counted, call.budget, run.measure,
                                 None if best is None else measured_flops_of(best[0]))
        if found is None:
            return None
        plain = Schedule(plain=True)
        plan = self._plan(run, run.whole_graph, simulate(run.whole_graph, plain), plain,
                          Outcome.counted(found.measured, found.flops))
        return dataclasses.replace(plan, predicted_peak_bytes=None, recompute_flops=found.flops, segment_peaks=(),
                                   layer_plan=found.plan), found.program

    def _calibrated(self, call: Call, model: Modelled, measure: Measure) -> tuple[ProgramGraph, ProgramGraph, int]:
        """The planned graph and the graph of ``fn`` as written (loops whole), each
        calibrated on XLA's peak for its program as written; and fn's own peak."""
        # fn's own: the program read for the facts, re-evaluated equation by equation, can peak elsewhere.
        plain_peak = measure(self.fn)
        traced, compiled = model.traced, model.compiled
        logger.info("%s: %d equations, plain peak %s on XLA, budget %s", getattr(self.fn, "__name__", "fn"),
                    len(traced.jaxpr.jaxpr.eqns), format_bytes(plain_peak), format_bytes(call.budget))
        # The model is calibrated on the flat program as written; with scans
        # unrolled, that is another program than fn (no loop, fused across
        # iterations), and usually a lower peak.
        flat_peak = plain_peak
        if traced.unrolled_scans:  # the flat program as written, which ``compiled`` is when read
            flat_peak = compiled.peak_bytes if compiled else measure(self._program(model.graph,
                                                                                   Schedule(plain=True)))
        graph = calibrate(model.graph, flat_peak)
        whole_graph = graph if traced is model.whole else calibrate(
            program_model(call.step, call.options.model_options.as_written(), model.whole).graph, plain_peak)
        return graph, whole_graph, plain_peak

    def _loop_plan(self, run: Search, best: Planned | None) -> Planned | None:
        """The cheapest of fn's loop plans (scans kept as loops, :mod:`remat_opt.planner._loop_planning`)
        that XLA fits, if it recomputes fewer FLOPs than ``best``; each measured or counted, and
        kept for the error, with the seconds CP-SAT spent choosing the bodies' saved values."""

        def make_plan(graph: ProgramGraph, sim: Simulation, outcome: Outcome) -> Plan:
            return self._plan(run, graph, sim, Schedule(plain=True), outcome)

        call, budget = run.call, run.call.budget
        progress.stage("loop plans")
        search = LoopSearch(self.fn, run.model.whole, call.args, call.kwargs, call.argnums, call.nums,
                            call.options.cost_model, call.has_aux, run.whole_graph.plain_storage_scale,
                            run.baseline_flops, budget, run.measure, make_plan)
        # CP-SAT's body plans first: a built-in loop plan is measured only if it recomputes less.
        bodies = body_plans(search, call.options)
        body_ceiling = min((c.flops for c in bodies if c.measured <= budget), default=None)
        nothing_flops = bodies[0].flops if bodies else 0  # the loop saving nothing in the body comes first
        run.attempts.loops = [*bodies, *loop_plans(search, body_ceiling, nested_floor=nothing_flops)]
        run.attempts.solve_seconds += sum(c.seconds for c in bodies)
        cheapest = min((c for c in run.attempts.loops if c.measured <= budget), key=lambda c: c.flops, default=None)
        if cheapest is None or (best is not None and cheapest.flops >= measured_flops_of(best[0])):
            return None
        return search.plan(cheapest), cheapest.program

    def _recalled(self, run: Search) -> Planned | None:
        """The lowest-memory schedule an earlier search of this program measured, if XLA fits it
        in the budget (:mod:`remat_opt.cache._lowest`): an error named its peak as a budget that works."""
        schedule = recall(run.model.key, run.call.budget, cache_directory(run.call.options.cache))
        if schedule is None:
            return None
        program = self._program(run.graph, schedule)
        measured = run.measure(program)
        logger.info("the lowest-memory schedule of an earlier search: measured %s", format_bytes(measured))
        if measured > run.call.budget:
            return None
        return self._finish(run, simulate(run.graph, schedule), schedule, program, Outcome(measured))

    def _keep_set_plan(self, run: Search, best: Planned | None) -> Planned | None:
        """The keep-set XLA fits in the budget (:func:`remat_opt.solve._keep_sets.measured_keep_set`),
        as a plan, if it recomputes less than ``best``; else ``None``. Not on a mesh: its greedy
        ranks the matmuls by FLOPs per byte and prices no collective gathered again."""
        if is_sharded(run.call.args, run.call.kwargs):
            return None
        program_of = functools.cache(lambda schedule: self._program(run.graph, schedule))
        # Where nothing fits yet, every keep-set of a small program is measured before a refusal.
        found = measured_keep_set(run.graph, run.call.budget, lambda schedule: run.measure(program_of(schedule)),
                                  exhaustive=best is None)
        if found is None:
            return None
        schedule, measured = found
        plan = self._finish(run, simulate(run.graph, schedule), schedule, program_of(schedule), Outcome(measured))
        logger.info("keep-set measured on XLA: %s, %s FLOPs recomputed", format_bytes(measured),
                    f"{measured_flops_of(plan[0]):,}")
        return plan if best is None or measured_flops_of(plan[0]) < measured_flops_of(best[0]) else None

    def _from_front(self, run: Search, best: Planned | None) -> Planned | None:
        """The plan of the program's front (:mod:`remat_opt.cache._front`) that fits the budget with
        fewer recomputed FLOPs than ``best``, if XLA confirms it; else ``None``."""
        point = _front.cheapest(run.model.key, run.call.budget, cache_directory(run.call.options.cache))
        if point is None or (best is not None and point.flops >= measured_flops_of(best[0])):
            return None
        program = self._program(run.graph, point.schedule)
        measured = run.measure(program)  # compiled before in this process: its figures are kept
        logger.info("the front's schedule for this budget: measured %s", format_bytes(measured))
        if measured > run.call.budget:
            return None
        return self._finish(run, simulate(run.graph, point.schedule), point.schedule, program, Outcome(measured))

    RETRY_MARGIN = 100
    """A re-solve's target is under the last one by the overshoot plus 1/RETRY_MARGIN of the budget."""

    RELAX_SLACK = 0.02
    """A plan XLA fits and the model over-predicted by more than this share of the
    budget is re-solved under a target loosened by the error (:mod:`remat_opt.planner._steering`)."""

    MEASURED_CANDIDATES = 3
    """Schedules outside CP-SAT's search measured on XLA, at most, per tier and plan; in the
    first tier one more, the cheapest the model fits, when these are all predicted over; and
    in every tier, what the Chen and Revolve baselines measure."""

    MODEL_SLACK = 0.15
    """How far over the budget the model may predict a schedule that is still worth
    measuring: it over-predicts heavily segmented plans (on attention models by up to
    a fifth), and a plan XLA fits is a plan."""

    def _measured_schedules(self, run: Search, best: Planned | None) -> Planned | None:
        """The cheapest schedule outside CP-SAT's search that XLA fits in the budget with fewer
        recomputed FLOPs than ``best`` (or as few, where ``best`` is a loop plan), if any; the
        lowest-memory one XLA measured is kept for the error when nothing fits.

        The model ranks them in tiers (:func:`remat_opt.solve._outside.outside_tiers`:
        within :attr:`MODEL_SLACK` of the budget, the cheapest first, counted on
        the traced gradient as the ceiling is; then, when
        nothing else fits, the lowest), at most :attr:`MEASURED_CANDIDATES` each (the first
        one more where they are all predicted over the budget), and besides them what the
        Chen and Revolve baselines measure, wherever the model puts it; XLA decides.
        Their FLOP counts are kept under the program's key at any budget (:func:`_count_key`,
        :mod:`remat_opt.cache._counted`): a sweep of budgets counts each once.
        """
        started = time.perf_counter()
        graph, budget, count_key = run.graph, run.call.budget, _count_key(run)
        ceiling_flops = None if best is None else measured_flops_of(best[0]) + int(best[0].loop_plan is not None)
        # Each schedule's program built once: its gradient's trace (kept with the function,
        # traced_step) serves its FLOP count and its compile.
        program_of = functools.cache(lambda schedule: self._program(graph, schedule))
        traced_flops = functools.cache(lambda schedule: counted_flops(
            count_key, schedule, lambda: step_flops(run.call, program_of(schedule))) - run.baseline_flops)
        progress.stage("ranking other schedules")
        tiers = outside_tiers(graph, budget, ceiling_flops, self.MODEL_SLACK, self.MEASURED_CANDIDATES, traced_flops)
        seconds = time.perf_counter() - started
        measured_plans: list[Planned] = []
        for tier in tiers:
            fitting = []
            for k, (schedule, sim) in enumerate(tier, 1):
                progress.stage("other schedules: candidate", k, len(tier))
                program = program_of(schedule)
                measured = run.measure(program)
                logger.info("candidate %d/%d (%d-level schedule): measured %s, predicted %s", k, len(tier),
                            schedule.depth(), format_bytes(measured), format_bytes(sim.peak_bytes))
                status, gap = ("FEASIBLE", 1.0) if sim.recompute_flops else ("OPTIMAL", 0.0)
                outcome = Outcome(measured, traced_flops(schedule), status, gap, seconds, len(measured_plans) + 1)
                plan = (self._plan(run, graph, sim, schedule, outcome), program)
                measured_plans.append(plan)
                if measured <= budget:
                    fitting.append(plan)
                    if tier is tiers[0]:
                        break  # the cheapest the model fits, and XLA agrees
            if fitting:
                return min(fitting, key=lambda p: measured_flops_of(p[0]))
        run.attempts.lowest_other = min(measured_plans, key=lambda p: measured_peak_of(p[0]), default=None)
        return None

    def _steering(self, run: Search) -> Steering:
        """This search's limits and stages, for CP-SAT's search steered by XLA (:mod:`remat_opt.planner._steering`)."""
        options = run.call.options
        return Steering(options.solver, options.max_attempts, self.RELAX_SLACK, self.RETRY_MARGIN,
                        self.FALLBACK_CANDIDATES, self.MODEL_SLACK, functools.partial(self._program, run.graph),
                        run.measure, functools.partial(self._finish, run), functools.partial(self._infeasible, run))

    def _policy_plan(self, run: Search, candidate: PolicyCandidate, solve_seconds: float) -> Planned:
        """The plan of a measured whole-function policy; the model does not describe its program."""
        plain = Schedule(plain=True)
        plan = self._plan(run, run.whole_graph, simulate(run.whole_graph, plain), plain,
                          Outcome.counted(candidate.measured, candidate.flops, solve_seconds))
        plan = dataclasses.replace(plan, predicted_peak_bytes=None, recompute_flops=candidate.flops,
                                   segment_peaks=(), whole_policy=candidate.policy)
        return plan, candidate.program

    def _program(self, graph: ProgramGraph, schedule: Schedule) -> Callable[..., Any]:
        """``fn`` under ``schedule``, as this function's options rewrite it."""
        return apply_schedule(self.fn, graph, schedule, compute_saved_once=self.options.compute_saved_once)

    def _finish(self, run: Search, sim: Simulation, schedule: Schedule, program: Callable[..., Any],
                outcome: Outcome) -> Planned:
        """The plan of ``program``, ``schedule`` on the planned graph (``sim``: its simulation), with
        the FLOPs its jaxpr recomputes counted."""
        outcome = dataclasses.replace(outcome, flops=step_flops(run.call, program) - run.baseline_flops)
        return self._plan(run, run.graph, sim, schedule, outcome), program

    def _infeasible(self, run: Search, schedule: Schedule, measured: int) -> InfeasibleBudgetError:
        """The error for a budget below reach: the lowest-memory plan's peak on XLA
        is the budget that works (XLA is the judge, not the model), unless the
        program as written peaks lower (remat cannot help it)."""
        predicted = simulate(run.graph, schedule).peak_bytes
        detail = (f"(XLA measured {measured:,} bytes for the lowest-memory plan; "
                  f"the model predicted {predicted:,}.)")
        if run.plain_peak < measured:
            detail += f" The program as written peaks lower, at {run.plain_peak:,} bytes."
        return InfeasibleBudgetError(run.call.budget, min(measured, run.plain_peak), detail=detail,
                                     schedule=schedule)

    def _plan(self, run: Search, graph: ProgramGraph, sim: Simulation, schedule: Schedule,
              outcome: Outcome) -> Plan:
        """The plan of ``schedule`` on ``graph`` (``sim``: its simulation), as measured; a schedule
        with its FLOPs counted joins the program's front (:mod:`remat_opt.cache._front`)."""
        options = run.call.options
        if outcome.flops is not None and not schedule.plain:
            _front.add(run.model.key, outcome.peak, outcome.flops, schedule, cache_directory(options.cache),
                       qualified_name(self.fn))
        return Plan(
            graph=annotate(graph, sim),
            budget_bytes=options.budget_bytes,
            predicted_peak_bytes=sim.peak_bytes,
            measured_peak_bytes=outcome.peak,
            plain_peak_bytes=run.plain_peak,
            recompute_flops=sim.recompute_flops,
            measured_recompute_flops=outcome.flops,
            baseline_flops=run.baseline_flops,
            status=outcome.status,
            gap=outcome.gap,
            solve_seconds=outcome.seconds,
            attempts=outcome.attempts,
            schedule=schedule,
            jax_version=jax.__version__,
            computed_once=len(once_values(graph, schedule)) if options.compute_saved_once else 0,
            segment_peaks=sim.segment_peaks,
        )


Strategy = Callable[[Search, Planned | None], Planned | None]
"""One strategy of a search: given the plan that fits with the fewest FLOPs so far (or ``None``),
a measured plan that fits the budget and takes its place, or ``None``."""


def _count_key(run: Search) -> str | None:
    """The key FLOP counts are kept under (:mod:`remat_opt.cache._counted`): the program's at any
    budget, where it names the cost model; ``None`` (not kept) where it cannot."""
    return run.model.key if names_cost_model(run.call.options.cost_model) else None


def step_flops(call: Call, program: Callable[..., Any]) -> int:
    """FLOPs of ``program``'s gradient step on the call, as the cost model counts them on its jaxpr."""
    return gradient_flops(program, call.args, call.kwargs, call.nums, call.options.cost_model, call.has_aux)
