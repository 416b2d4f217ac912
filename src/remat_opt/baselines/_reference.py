"""A function's reference measurements, and the plans a strategy is measured into.

Every baseline of one function and signature is compared with the same
plain program, measured once (XLA's peak, the gradient's FLOPs, the
calibrated program graph), and turned into the :class:`Plan` that
:func:`remat_opt.optimize` returns, measured the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import networkx as nx

from .._budget import parse_bytes
from ..program._cost import CostModel
from ..memory._facts import check_known, read_plain, with_memory_facts
from ..program._graph import ProgramGraph, build_graph
from ..memory._measure import abstract, gradient_flops, peak_bytes
from ..memory._simulate import calibrate, simulate
from .._plan import annotate
from ..rewrite._apply import apply_schedule
from .._plan import Plan
from .._schedule import Schedule
from ..program._trace import grad_argnums, normalize_argnums, trace

STATUS = "BASELINE"


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


def reference(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    argnums: int | Sequence[int],
    budget_bytes: int | str,
    cost_model: CostModel | None,
    xla_facts: bool = True,
) -> Reference:
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {fn!r} ({type(fn).__name__}). Pass the loss function itself.")
    budget = parse_bytes(budget_bytes, argument="budget_bytes")
    args, kwargs = abstract(tuple(args)), abstract(dict(kwargs))
    nums_t = normalize_argnums(argnums, len(args))
    nums = grad_argnums(nums_t)
    plain_peak = peak_bytes(fn, *args, argnums=nums, **kwargs)
    traced = trace(fn, args, kwargs, nums_t)
    graph = build_graph(traced, cost_model)
    compiled = read_plain(fn, traced, args, kwargs, nums) if xla_facts else None
    if not xla_facts:
        check_known(graph)
    graph = calibrate(with_memory_facts(graph, compiled), plain_peak)
    return Reference(
        fn=fn,
        args=args,
        kwargs=kwargs,
        nums=nums,
        budget_bytes=budget,
        cost_model=cost_model,
        graph=graph,
        plain_peak_bytes=plain_peak,
        baseline_flops=gradient_flops(fn, args, kwargs, nums, cost_model),
    )


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
