"""Plans for scans kept as loops, each measured on XLA.

Two families (:class:`remat_opt.rewrite._loops.LoopPlan`):

* :func:`loop_plans`: the plans users write by hand on a loop, JAX's built-in
  policies on the body, with and without sqrt(n) nesting of the iterations, and
  the name recipes over the ``checkpoint_name``s the body carries (MaxText's menu).
  Each is a baseline the planner measures itself, so none that fits recomputes
  less than the plan, and a budget is refused only below all of them.
  No solver: a finite family, measured in order of recomputed FLOPs up to the
  first that fits.
* :func:`body_plans`: what the body saves, chosen by CP-SAT over the body's
  own graph (:mod:`remat_opt.solve._body`), under the budget. The memory one
  iteration may keep is read off XLA: the program saving nothing in the body
  is measured first (``P0``), and a saved set of ``b`` bytes per iteration is
  expected to cost ``P0 + length * b`` at first. Each chosen set is measured:
  over the budget, the next cap is under it by the overshoot (and 1% of the
  budget) per iteration; under it by more than :data:`TIGHT`, over it by what
  is left. XLA often keeps less than the saved bytes suggest (a saved value
  can spare the backward a buffer of its own), so when the solver returns a
  set already measured, or one that recomputes no less than a set that fits
  (not worth a compile), the step is doubled, up to 8 times what is left,
  and the measurement decides. When saving nothing is itself over the
  budget, the sum says no set fits, yet XLA can hold less for a set than for
  none: a saved value can split the body's backward in two, so that one part
  runs (and frees its buffers) before the rest is recomputed (a decoder
  saving the residual stream between attention and MLP). The search then
  probes sets of one carry's bytes, twice that, and so on, while each
  measures lower than the last, until one fits; it steers from there as
  usual. The loop stays a loop: every compile
  costs what one compile of the program costs, whatever the depth, and the
  solve's size is the body's.

Both return every plan they measured; the planner keeps the one that fits
with the fewest recomputed FLOPs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._budget import format_bytes
from .._options import PlanOptions
from .._plan import Plan
from .._schedule import Schedule, Simulation
from ..memory._facts import model_graph
from ..memory._measure import gradient_flops
from ..memory._simulate import simulate
from ..program._cost import CostModel
from ..program._graph import ProgramGraph, build_graph
from ..program._manual import shard_map_body
from ..program._scan_body import ScanBody, scan_body
from ..program._trace import TracedProgram, planned_bodies, trace, with_signature
from ..rewrite._loops import LoopPlan, loop_candidates, loop_program, recipe_candidates, scan_lengths, user_names
from ..solve._body import BodyChoice, choose_saved
from ._search_state import Outcome

logger = logging.getLogger("remat_opt")

TIGHT = 0.005
"""A fitting saved set within this share of the budget ends the search; one
further under it is re-solved with the cap loosened by XLA's figure."""

MakePlan = Callable[[ProgramGraph, Simulation, Outcome], Plan]
"""``(graph, sim, outcome) -> Plan``: the plan of a program modelled as ``graph`` (``sim``, its
simulation), with what it measured."""


@dataclass(frozen=True)
class LoopCandidate:
    """A loop plan measured on XLA, with what its :class:`Plan` reports.

    Attributes:
        loop: the loop plan.
        program: ``fn`` with it applied.
        flops: FLOPs it recomputes (counted on its jaxpr).
        measured: XLA's peak of its gradient step.
        status, gap, seconds, attempts: the solver's verdict, its time and the
            solves it took (a built-in plan: ``"FEASIBLE"``, gap 1, unless it
            recomputes nothing).
    """

    loop: LoopPlan
    program: Callable[..., Any]
    flops: int
    measured: int
    status: str
    gap: float
    seconds: float
    attempts: int

    @property
    def outcome(self) -> Outcome:
        """What it measured and how it was found, as the planner's plans record it."""
        return Outcome(self.measured, self.flops, self.status, self.gap, self.seconds, self.attempts)


@dataclass(frozen=True)
class LoopSearch:
    """What every loop plan of one call is built, counted and measured with.

    Attributes:
        fn: the user's function.
        whole: ``fn`` traced with its scans whole.
        args, kwargs, argnums, nums: the call, and its differentiated arguments
            (normalized, and as ``jax.grad`` takes them).
        cost_model: FLOPs per equation (``None``: the default).
        has_aux: ``fn`` returns ``(loss, aux)``.
        scale: the storage scale calibrated on ``whole`` as written.
        baseline_flops: FLOPs of the plain gradient step.
        budget: the budget in bytes.
        measure: XLA's peak of a program's gradient step.
        make_plan: a :class:`Plan` from a measured candidate.
    """

    fn: Callable[..., Any]
    whole: TracedProgram
    args: tuple
    kwargs: dict
    argnums: tuple[int, ...]
    nums: Any
    cost_model: CostModel | None
    has_aux: bool
    scale: float
    baseline_flops: int
    budget: int
    measure: Callable[[Callable[..., Any]], int]
    make_plan: MakePlan

    def program(self, loop: LoopPlan) -> tuple[int, Callable[..., Any]]:
        """``loop`` applied to ``fn``, and the FLOPs it recomputes (counted on its jaxpr)."""
        program = with_signature(self.fn, self.whole, loop_program(self.whole, loop))
        flops = gradient_flops(program, self.args, self.kwargs, self.nums, self.cost_model, self.has_aux)
        return flops - self.baseline_flops, program

    def plan(self, c: LoopCandidate) -> Plan:
        """The :class:`Plan` of a measured loop plan (built for the one chosen: it
        traces the program and models it); the model's prediction uses ``scale``."""
        graph = model_graph(trace(c.program, self.args, self.kwargs, self.argnums), self.cost_model)
        graph = dataclasses.replace(graph, plain_storage_scale=self.scale)
        sim = simulate(graph, Schedule(plain=True))
        plan = self.make_plan(graph, sim, c.outcome)
        return dataclasses.replace(plan, recompute_flops=c.flops, loop_plan=c.loop)


def loop_plans(search: LoopSearch, ceiling_flops: int | None = None, nested_floor: int = 0) -> list[LoopCandidate]:
    """The built-in loop plans, measured in order of recomputed FLOPs up to the
    first that fits the budget: the cheapest that fits, and every one cheaper.
    All of them when none fits (the error names the lowest peak). Only those
    recomputing fewer than ``ceiling_flops`` (a plan that already fits) are measured.

    Scans of any length count, unrolled or not: a scan too long to unroll is
    planned by these and :func:`body_plans` alone.

    Nesting a policy's plan recomputes all it did and each group's forward,
    every iteration's once more, so a nested plan is not traced when its
    policy alone, or ``nested_floor`` (the FLOPs of the loop saving nothing
    in its body, when measured), reaches the ceiling. (On the zoo's scanned
    GPT at three sizes and three small scanned programs, no nested plan
    recomputed less than the loop saving nothing.)
    """
    lengths = scan_lengths(search.whole)
    if not lengths:
        return []
    candidates = []
    unnested: dict[str | None, int] = {}  # policy -> FLOPs of its plan without nesting
    family = [*loop_candidates(lengths), *recipe_candidates(user_names(search.whole))]
    for loop in sorted(family, key=lambda loop: loop.chunks > 1):  # without nesting first
        floor = max(unnested.get(loop.policy, 0), nested_floor) if loop.chunks > 1 else 0
        if ceiling_flops is not None and floor >= ceiling_flops:
            continue
        flops, program = search.program(loop)
        if loop.chunks == 1:
            unnested[loop.policy] = flops
        if ceiling_flops is None or flops < ceiling_flops:
            candidates.append((flops, program, loop))
    plans = []
    for flops, program, loop in sorted(candidates, key=lambda c: c[0]):  # stable: ties keep their order
        measured = search.measure(program)
        # Chosen among a finite family by measurement: no bound but 0 FLOPs.
        status, gap = ("FEASIBLE", 1.0) if flops > 0 else ("OPTIMAL", 0.0)
        plans.append(LoopCandidate(loop, program, flops, measured, status, gap, 0.0, 1))
        if measured <= search.budget:
            break
    return plans


def body_plans(search: LoopSearch, options: PlanOptions) -> list[LoopCandidate]:
    """The loop saving nothing in the body of the program's one planned scan,
    first, then the saved sets CP-SAT chose for it (with ``options.solver``, at
    most ``options.max_attempts`` compiles), each measured on XLA (see the
    module's docstring). Empty for a program with no planned scan or several
    (their bodies would share one budget)."""
    positions = planned_bodies(search.whole)
    if len(positions) != 1:
        return []
    kind = search.whole.jaxpr.jaxpr.eqns[positions[0]].primitive.name
    if kind == "shard_map":  # one call, planned per device: a body of one iteration
        body = ScanBody(positions[0], 1, shard_map_body(search.whole, positions[0]))
    else:
        body = scan_body(search.whole, positions[0])
    graph = build_graph(body.program, search.cost_model)
    saving_nothing = LoopPlan(None, saved=(), body=kind)
    flops, program = search.program(saving_nothing)
    floor = search.measure(program)
    # Not a solver's choice: reported as a built-in loop plan is.
    status, gap = ("FEASIBLE", 1.0) if flops > 0 else ("OPTIMAL", 0.0)
    nothing = LoopCandidate(saving_nothing, program, flops, floor, status, gap, 0.0, 1)
    logger.info("%s body: %d equations, %d iterations; saving nothing in it peaks at %s on XLA",
                kind, len(graph.units), body.length, format_bytes(floor))
    return [nothing, *_saved_sets(search, graph, body, kind, floor, options)]


def _saved_sets(search: LoopSearch, graph: ProgramGraph, body: ScanBody, kind: str, floor: int,
                options: PlanOptions) -> list[LoopCandidate]:
    """The body's saved sets CP-SAT chooses under a per-iteration cap that XLA's
    measurements steer (the module's docstring), each measured; ``floor`` is the
    measured peak of the loop saving nothing."""
    max_attempts = options.max_attempts
    plans: list[LoopCandidate] = []
    seen: set[tuple[str, ...]]  # the saved sets measured
    cap, seen, stretch, compiles = (search.budget - floor) // body.length, {()}, 1, 0
    measured = floor  # the last set measured: saving nothing, so far
    fitting_flops = math.inf  # per iteration, of the cheapest set measured under the budget
    # Saving nothing is over the budget: probe sets of one carry's bytes, then twice that, ...
    probing = floor > search.budget and body.carry_bytes > 0
    if probing:
        cap = body.carry_bytes
    for _ in range(3 * max_attempts):  # solves; compiles are fewer (a repeated set is not measured)
        if cap <= 0 or compiles == max_attempts:
            break
        start = time.perf_counter()
        choice = choose_saved(graph, cap, options.solver)
        seconds = time.perf_counter() - start
        # The same set again, or one no cheaper than a set that fits: reach further, or stop.
        if choice.saved in seen or choice.recompute_flops >= fitting_flops:
            if probing:
                cap *= 2
                continue
            if stretch >= 8 or measured > search.budget:
                break
            stretch *= 2
            cap = choice.saved_bytes + stretch * (search.budget - measured) // body.length
            continue
        seen.add(choice.saved)
        compiles += 1
        plans.append(_measured_set(search, choice, kind, seconds, compiles, max_attempts))
        previous, measured = measured, plans[-1].measured
        if measured <= search.budget:
            fitting_flops = min(fitting_flops, choice.recompute_flops)
        if search.budget - TIGHT * search.budget <= measured <= search.budget:
            break
        if probing and measured > search.budget:  # lower than the last probe: probe twice the bytes
            if measured >= previous:
                break
            cap *= 2
            continue
        probing = False  # a set fits: steer from it as usual
        if measured > search.budget:  # under this set by the overshoot and a margin
            over = measured - search.budget + search.budget // 100
            cap, stretch = choice.saved_bytes - -(-over // body.length), 1
        else:  # over it by the budget left, stretched when sets repeat
            cap = choice.saved_bytes + stretch * (search.budget - measured) // body.length
    return plans


def _measured_set(search: LoopSearch, choice: BodyChoice, kind: str, seconds: float, compiles: int,
                  max_attempts: int) -> LoopCandidate:
    """The loop saving ``choice`` in its body, counted and measured on XLA (the ``compiles``-th)."""
    loop = LoopPlan(None, saved=choice.saved, body=kind)
    flops, program = search.program(loop)
    measured = search.measure(program)
    logger.info("%s body, solve %d of %d: %d values saved (%s per iteration, %s), XLA %s (budget %s)",
                kind, compiles, max_attempts, len(choice.saved), format_bytes(choice.saved_bytes), choice.status,
                format_bytes(measured), format_bytes(search.budget))
    return LoopCandidate(loop, program, flops, measured, choice.status, choice.gap, seconds, compiles)
