"""What a baseline is measured with, its reference measurements, and the plans a strategy is measured into.

A baseline is asked about one call (:class:`BaselineCall`: the function, its arguments,
what is differentiated, the budget, how FLOPs are counted). Every baseline of one
function and signature is compared with the same plain program, measured once (XLA's
peak, the gradient's FLOPs, the calibrated program graph), and turned into the
:class:`Plan` that :func:`remat_opt.optimize` returns, measured the same way.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import jax
import networkx as nx

from .._budget import parse_bytes
from .._jax_private import trace_context
from ..program._cost import CostModel
from ..program._graph import ProgramGraph
from ..memory._measure import StepCall, abstract, gradient_flops, peak_bytes, per_function, signature
from ..memory._pipeline import ModelOptions, program_model
from ..memory._calibrate import calibrate
from ..memory._simulate import simulate
from .._plan import annotate
from ..rewrite._apply import apply_schedule
from .._plan import Plan
from .._schedule import Schedule
from ..program._trace import grad_argnums, normalize_argnums

STATUS = "BASELINE"


@dataclass(frozen=True, eq=False)
class BaselineCall:
    """What a baseline is measured with: ``fn`` called on ``args`` and ``kwargs``,
    differentiated in ``argnums``, its plan compared against ``budget_bytes``, its
    FLOPs counted by ``cost_model``. Every baseline function takes one, so several
    baselines of one call are asked the same question.

    Checked when a baseline measures it (:func:`reference`).

    Attributes:
        fn: the loss function, returning a scalar; for the per-layer baselines it takes
            the zoo's ``layer_wrapper`` keyword (see :mod:`remat_opt.zoo`).
        args: its positional arguments (arrays or ``jax.ShapeDtypeStruct``).
        budget_bytes: the budget the plan is compared against (``plan.fits``): bytes,
            or a size such as ``"512MiB"``.
        kwargs: keyword arguments of ``fn``, not differentiated.
        argnums: positional arguments that are differentiated.
        cost_model: FLOPs per equation; the default counts dots and convs exactly.

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> call = BaselineCall(lambda w: jnp.sum(jnp.tanh(w @ w)), (jnp.ones((8, 8)),), budget_bytes="1MiB")
        >>> [remat_opt.no_remat(call).fits, remat_opt.checkpoint_policy(call, "nothing_saveable").fits]
        [True, True]
    """

    fn: Callable[..., Any]
    args: tuple
    _: KW_ONLY
    budget_bytes: int | str
    kwargs: dict = field(default_factory=dict)
    argnums: int | Sequence[int] = 0
    cost_model: CostModel | None = None


@dataclass(frozen=True)
class Reference:
    """What every baseline of one function and signature is compared with."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    nums: int | tuple[int, ...]
    budget_bytes: int
    cost_model: CostModel | None
    graph: ProgramGraph
    plain_peak_bytes: int
    baseline_flops: int

    def peak(self, program: Callable[..., Any]) -> int:
        return peak_bytes(program, *self.args, argnums=self.nums, **self.kwargs)

    def flops(self, program: Callable[..., Any]) -> int:
        return gradient_flops(program, self.args, self.kwargs, self.nums, self.cost_model) - self.baseline_flops


def reference(call: BaselineCall, xla_facts: bool = True) -> Reference:
    """``call`` checked, and its plain program measured: what its baselines are compared with.

    Args:
        call: the function, arguments and budget the baselines are asked about.
        xla_facts: read XLA's account of the plain program for what no rule of the
            memory model knows (else warn where the rules guess).

    Raises:
        TypeError: ``call.fn`` is not callable, or an argument has the wrong type.
        ValueError: ``call.budget_bytes`` or ``call.argnums`` is invalid.
    """
    fn, cost_model = call.fn, call.cost_model
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {fn!r} ({type(fn).__name__}). Pass the loss function itself.")
    budget = parse_bytes(call.budget_bytes, argument="budget_bytes")
    args, kwargs = abstract(tuple(call.args)), abstract(dict(call.kwargs))
    nums_t = normalize_argnums(call.argnums, len(args))
    nums = grad_argnums(nums_t)
    graph, plain_peak, flops = _plain_of(StepCall(fn, args, kwargs, nums), cost_model, xla_facts)
    return Reference(fn=fn, args=args, kwargs=kwargs, nums=nums, budget_bytes=budget, cost_model=cost_model,
                     graph=graph, plain_peak_bytes=plain_peak, baseline_flops=flops)


_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_of(call: StepCall, cost_model: CostModel | None, xla_facts: bool) -> tuple[ProgramGraph, int, int]:
    """The plain program of ``call``: its calibrated graph, XLA's peak and the gradient's FLOPs.
    Measured once per function, signature, options and JAX configuration in a process, so that
    the baselines of one call (each is its own public function) compile the plain step once."""
    key = (signature(call.args, call.kwargs), repr(call.argnums), cost_model, xla_facts, trace_context(),
           jax.default_backend(), os.environ.get("XLA_FLAGS", ""))
    try:
        hash(cost_model)
        memo = per_function(_PLAIN, call.fn)
    except TypeError:  # an unhashable cost model: measured every time
        memo = {}
    if key not in memo:
        plain_peak = peak_bytes(call.fn, *call.args, argnums=call.argnums, **call.kwargs)
        # fn as written, whole arrays' bytes (memory._pipeline), calibrated on its peak.
        model = program_model(call, ModelOptions(cost_model, xla_facts=xla_facts))
        flops = gradient_flops(call.fn, call.args, call.kwargs, call.argnums, cost_model)
        memo[key] = (calibrate(model.graph, plain_peak), plain_peak, flops)
    return memo[key]


def bare_graph(graph: ProgramGraph) -> nx.DiGraph:
    g = graph.nx_graph()
    nx.set_node_attributes(g, None, "decision")
    nx.set_node_attributes(g, None, "segment")
    return g


def make_plan(ref: Reference, strategy: str, **fields: Any) -> Plan:
    defaults: dict[str, Any] = dict(
        budget_bytes=ref.budget_bytes,
        plain_peak_bytes=ref.plain_peak_bytes,
        baseline_flops=ref.baseline_flops,
        status=STATUS,
        gap=0.0,
        solve_seconds=0.0,
        attempts=1,
        strategy=strategy,
        jax_version=jax.__version__,
    )
    return Plan(**{**defaults, **fields})


def policy_plan(ref: Reference, strategy: str, program: Callable[..., Any]) -> Plan:
    measured_flops = ref.flops(program)
    return make_plan(
        ref,
        strategy,
        graph=bare_graph(ref.graph),
        predicted_peak_bytes=None,
        measured_peak_bytes=ref.peak(program),
        recompute_flops=measured_flops,
        measured_recompute_flops=measured_flops,
        schedule=None,
    )


def schedule_plan(
    ref: Reference, strategy: str, schedule: Schedule, measured: int | None = None, **fields: Any
) -> Plan:
    program = apply_schedule(ref.fn, ref.graph, schedule)
    sim = simulate(ref.graph, schedule)
    return make_plan(
        ref,
        strategy,
        graph=annotate(ref.graph, sim),
        predicted_peak_bytes=sim.peak_bytes,
        measured_peak_bytes=ref.peak(program) if measured is None else measured,
        recompute_flops=sim.recompute_flops,
        measured_recompute_flops=ref.flops(program),
        schedule=schedule,
        **fields,
    )
