"""The planner behind ``optimize``: :class:`OptimizedFunction`, the pipeline run once per signature.

trace → graph → solve → rewrite → measure, once per input signature, cached.
The judge is XLA: a plan is returned only after the rewritten gradient step
has been compiled and its peak measured at or under the budget. Each
measurement steers the solver's next target (tightened by an overshoot,
loosened by an over-prediction); if nothing fit, the lowest-memory schedules
are measured. Nested schedules (:mod:`remat_opt.solve._nesting`), Chen's
segmentations, a program's loop plans (:mod:`remat_opt.rewrite._loops`) and
JAX's built-in policies around the whole function (:mod:`remat_opt.planner._policy_planning`)
are measured too; the plan that fits with the fewest recomputed FLOPs is returned.
Each of these is a :data:`remat_opt.planner._flop_search.Strategy`, one signature for all, run
in turn by the FLOP search (:mod:`remat_opt.planner._flop_search`). On an accelerator the
step-time search (:mod:`remat_opt.planner._timed`) plans instead, and the FLOP search only where
none of its candidates fits. If nothing fits, :class:`InfeasibleBudgetError` says which budget
XLA confirms.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from .._budget import format_bytes
from ..cache._cache import qualified_name
from ..cache._call import Call
from .._errors import InfeasibleBudgetError
from ._floor import floor_refusal
from ._flop_search import FlopSearch, step_flops
from ._forward import forward_mode
from .._inputs import check_call
from ..cache._lowest import remember
from ._mesh import laid_out, measurer, per_device_error, sharded_twin, with_collectives
from . import _progress as progress
from .._options import PlanOptions
from .._plan import Plan, Planned, measured_peak_of
from ..cache._restore import cached_or_new_plan
from ._patience import Patience, Stalled
from ._search_state import Modelled
from ._candidates import TimedCall
from ._timed import timed_plan, with_step_time
from ._unfenced import unfenced
from ._verify import verified
from ..memory._measure import Signature, signature
from ..memory._pipeline import program_model
from ..memory._sharded import with_shardings
from ..program._trace import trace

logger = logging.getLogger("remat_opt")
"""Progress of a plan (stages, solves, measurements) at INFO level; silent unless configured,
e.g. ``logging.basicConfig(level=logging.INFO)``."""


def _refuse_under_floor(call: Call) -> None:
    """Raises the floor's refusal where ``call``'s budget is under its step's arguments and
    outputs: no search can help (:mod:`remat_opt.planner._floor`)."""
    refused = floor_refusal(call)
    if refused is not None:
        raise refused


class OptimizedFunction(FlopSearch):
    """``fn`` with gradient checkpoints placed by remat_opt; same signature and values.

    Calling it plans (once per argument shapes and dtypes) and runs the rewritten
    program; it composes with ``jax.jit``, ``jax.grad``, ``jax.value_and_grad``
    and ``jax.vjp``, and with ``eqx.filter_value_and_grad``: argument leaves that
    are not arrays (an Equinox module's functions, Python scalars) are static,
    closed over and part of the plan's key, as in ``jax.jit``'s
    ``static_argnums`` (compared by ``==``, or by identity when unhashable).

    Args:
        fn: the loss function.
        options: what its plans are asked for (:func:`remat_opt.optimize` makes them).
    """

    def __init__(self, fn: Callable[..., Any], options: PlanOptions):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self._cache: dict[Signature, Planned] = {}

    FALLBACK_PATIENCE = 5
    """Compiles in a row the FLOP search may make, after the step-time search found nothing that
    fits, with no peak below that search's least: the plain step, JAX's policies and the first
    of CP-SAT's lowest-memory schedules come first."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if forward_mode(args, kwargs):  # custom_vjp segments have no JVP: fn as written (remat_opt.planner._forward)
            return self.fn(*args, **kwargs)
        _, program = self._planned(args, kwargs)
        return program(*args, **kwargs)

    def plan(self, *args: Any, **kwargs: Any) -> Plan:
        """The plan for these arguments (solved and verified on first use, then cached)."""
        return self._planned(args, kwargs)[0]

    def _planned(self, args: tuple, kwargs: dict) -> Planned:
        options = self.options
        try:
            specs, kwargs_specs = laid_out(args, kwargs)  # tracers: the layout of the arrays under jit
            specs = with_shardings(specs, options.in_shardings)
        except TypeError:  # a leaf JAX cannot trace (a string array): the typed error names it
            check_call(self.fn, args, kwargs, options.argnums, options.has_aux)
            raise
        key = signature(specs, kwargs_specs)
        if key not in self._cache:
            twin = sharded_twin(self._cache, key)
            if twin is not None:
                return twin
            check_call(self.fn, args, kwargs, options.argnums, options.has_aux)  # remat_opt._inputs: typed errors
            constants = {k: getattr(self, k) for k in dir(type(self)) if k.isupper()}  # the search's
            call = Call.of(self.fn, specs, kwargs_specs, options, constants)
            # Shown once the plan takes its time (planner/_progress), loaded or searched.
            with progress.planning(getattr(self.fn, "__name__", "fn"), call.budget):
                self._cache[key] = cached_or_new_plan(call, self._make_plan)
        return self._cache[key]

    def _timed_plan(self, call: Call) -> Planned:
        """The fastest plan that fits, measured on the device (:mod:`remat_opt.planner._timed`).

        Where none of the step-time search's candidates fits (they are per-layer and per-body
        plans, and a program may have no layers), the FLOP search's plan, whose schedules reach
        lower, with its step time measured on the device; if that search refuses too, or makes
        :attr:`FALLBACK_PATIENCE` compiles in a row that reach no lower than the step-time search
        did (:mod:`remat_opt.planner._patience`), the refusal that names the lower peak."""
        _refuse_under_floor(call)
        timed = TimedCall(call.fn, call.args, call.kwargs, call.argnums, call.nums, call.has_aux,
                          call.budget, call.options.cost_model)
        try:
            return timed_plan(timed)
        except InfeasibleBudgetError as refused:
            logger.info("step-time search: nothing fits %s; the FLOP search's schedules", format_bytes(call.budget))
            try:
                planned = self._flop_plan(call, Patience(call.budget, refused.min_budget_bytes, self.FALLBACK_PATIENCE))
            except InfeasibleBudgetError as err:
                raise min((err, refused), key=lambda e: e.min_budget_bytes) from None
            except Stalled as stalled:
                raise stalled.refusal(refused) from None
        progress.stage("timing the FLOP search's plan on the device")
        return with_step_time(timed, planned)

    def _make_plan(self, call: Call) -> Planned:
        """The plan of ``call``'s search (the plan cache's way in is :func:`remat_opt.cache._restore.cached_or_new_plan`)."""
        if call.options.minimises_time():
            return self._timed_plan(call)
        return self._flop_plan(call)

    def _flop_plan(self, call: Call, patience: Patience | None = None) -> Planned:
        """The plan that fits with the fewest recomputed FLOPs (:meth:`_search`), verified as jit
        compiles it; each compile counted by ``patience``, where given."""
        options = call.options
        traced = trace(self.fn, call.args, call.kwargs, call.argnums, options.unroll_scans)
        # fn as written, loops whole: what a plain plan and the loop plans run.
        whole = call.whole_as(traced)
        _refuse_under_floor(call)
        # The program planned (memory._pipeline): a shard_map's body, per device on a mesh, with XLA's facts.
        modelled = program_model(call.step, options.model_options, traced)
        graph, compiled, partitioned = modelled.graph, modelled.compiled, modelled.partitioned
        traced = graph.traced

        collectives: dict[int, int] = {}  # on a mesh, per measured program's id: XLA's collective bytes
        on_mesh = collectives if partitioned is not None else None
        # Candidates are compiled for their figures only; the plan returned, as the user's jit compiles it.
        measure = progress.measuring(measurer(call.args, call.kwargs, call.nums, call.has_aux, on_mesh,
                                              figures_only=True))
        verify = progress.measuring(measurer(call.args, call.kwargs, call.nums, call.has_aux, on_mesh))
        if patience is not None:
            measure, verify = patience.watch(measure), patience.watch(verify)
        # The program's key at any budget: what an earlier search of it measured lowest (remat_opt.cache._lowest),
        # and the front every schedule measured joins (remat_opt.cache._front).
        model = Modelled(traced, whole, graph, compiled, call.key(None))
        try:  # stages: _progress
            planned = verified(self._search(call, model, measure), verify, call.budget,
                               lambda: self._search(call, model, verify))
            planned = unfenced(planned, functools.partial(self._program, graph), verify,
                               functools.partial(step_flops, call), call.budget)
        except InfeasibleBudgetError as err:
            if partitioned is None:
                raise
            raise per_device_error(err, call.args, call.kwargs, partitioned) from err
        plan, program = planned
        if plan.strategy == "remat_opt" and plan.loop_plan is None and plan.whole_policy is None \
                and plan.schedule is not None and not plan.schedule.plain:
            remember(model.key, measured_peak_of(plan), plan.schedule, None, qualified_name(self.fn))
        if partitioned is None:
            return planned
        return with_collectives(plan, graph, partitioned, collectives[id(program)], collectives[id(self.fn)],
                                options.links), program

