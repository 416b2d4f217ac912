"""What a planning call does differently when its arguments are sharded over a mesh.

The plan itself is made as for one device (the graph takes one device's bytes
and the collectives' costs, :mod:`remat_opt.memory._sharded`); around it,
each program is measured with its collective bytes too, an unreachable budget
says it is one device's, the returned plan carries XLA's collective figures,
and a call under ``jax.jit`` takes its tracers' layout from the call being
traced, or else finds the plan made for the same shapes on the mesh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from .._errors import InfeasibleBudgetError, InvalidBudgetError
from .._options import device_memory
from .._plan import Plan
from ..memory._compiles import PEAK_FIGURES_ONLY, compile_for_figures, compiled_figures, peak_as_jit_compiles
from ..memory._measure import abstract, memory_of, traced_step
from ..memory._sharded import Partitioned, collective_bytes, collective_decisions
from ..memory._timing import out_of_memory
from ..program._cost import Interconnect
from ..program._graph import ProgramGraph
from ..program._static import combine, mesh_sharding, split
from ..program._traced_layout import traced_layout

Measure = Callable[[Callable[..., Any]], int]


def measurer(args: tuple, kwargs: dict, nums: Any, has_aux: bool, collectives: dict[int, int] | None,
             figures_only: bool = False) -> Measure:
    """XLA's peak of a program's gradient step on these arguments; with
    ``collectives`` (a sharded program), each program's collective bytes too,
    by its id (the programs are kept alive while the ids stand for them).
    With ``figures_only``, each program is compiled with
    :data:`remat_opt.memory._compiles.FIGURES_ONLY`: the same figures, sooner.
    A program XLA cannot fit into the device (``RESOURCE_EXHAUSTED``) measures
    :func:`beyond_device`: it fits no budget the device holds, and is no crash."""
    measured: list[Callable[..., Any]] = []

    def compiled(lowered: Any) -> Any:
        return compile_for_figures(lowered) if figures_only else lowered.compile()

    def peak(lowered: Any) -> int:
        return memory_of(compiled(lowered))

    def peak_and_collectives(lowered: Any) -> tuple[int, int]:
        program = compiled(lowered)
        return memory_of(program), collective_bytes(program.as_text())

    suffix = ", figures only" if figures_only else ""

    def measure(f: Callable[..., Any]) -> int:
        try:
            return figure_of(f)
        except Exception as err:  # noqa: BLE001 - only XLA's out-of-memory is a figure
            if not out_of_memory(err):
                raise
            return beyond_device()

    def figure_of(f: Callable[..., Any]) -> int:
        lowered = traced_step(f, args, kwargs, nums, has_aux).lower()
        if collectives is None:
            return compiled_figures(lowered, PEAK_FIGURES_ONLY, peak) if figures_only else \
                peak_as_jit_compiles(lowered, peak)
        figure, collectives[id(f)] = compiled_figures(lowered, "peak and collectives" + suffix, peak_and_collectives)
        measured.append(f)
        return figure

    return measure


def beyond_device() -> int:
    """A peak no budget the device holds admits: one byte past its memory, or, on a device that
    reports none, past any."""
    try:
        return device_memory() + 1
    except InvalidBudgetError:
        return 2 ** 62


def per_device_error(err: InfeasibleBudgetError, args: tuple, kwargs: dict,
                     partitioned: Partitioned) -> InfeasibleBudgetError:
    """``err`` for a sharded program: its budget is one device's peak, which it says."""
    devices = max(len(x.sharding.device_set) for x in jax.tree_util.tree_leaves((args, kwargs))
                  if mesh_sharding(x) is not None)
    detail = (f"{err.detail} The arguments are sharded over {devices} devices, so budget_bytes is one "
              f"device's peak (XLA measured {partitioned.peak_bytes:,} bytes per device for the step as "
              "written): divide a budget for the whole mesh by the devices.")
    return InfeasibleBudgetError(err.budget_bytes, err.min_budget_bytes, detail=detail.strip(), schedule=err.schedule)


def with_collectives(plan: Plan, graph: ProgramGraph, partitioned: Partitioned, measured_collectives: int,
                     plain_collectives: int, interconnect: Interconnect) -> Plan:
    """``plan`` with XLA's collective bytes, and per collective equation its decision
    (from the plan's graph, when it is ``graph``'s: not a loop plan's)."""
    same = (plan.loop_plan is None and plan.whole_policy is None
            and plan.graph.number_of_nodes() == graph.nx_graph().number_of_nodes())
    decisions = dict(plan.graph.nodes(data="decision")) if same else {}
    return dataclasses.replace(plan, collective_bytes=measured_collectives,
                               plain_collective_bytes=plain_collectives,
                               collective_flops_per_byte=interconnect.flops_per_byte,
                               collectives=collective_decisions(graph, partitioned, decisions) if same else ())


def laid_out(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``abstract(args)`` and ``abstract(kwargs)``, each tracer leaf given the mesh layout of the
    array it stands for, where the call it comes from says it (:mod:`remat_opt.program._traced_layout`):
    a plan made under ``jax.jit`` is then the one ``plan()`` makes on the arrays."""
    leaves, static = split((args, kwargs))
    if not any(isinstance(x, jax.core.Tracer) for x in leaves):
        return abstract(args), abstract(kwargs)
    specs = [jax.ShapeDtypeStruct(jax.numpy.shape(x), jax.numpy.result_type(x), sharding=s)
             for x, s in zip(leaves, traced_layout(leaves))]
    return combine(specs, static)


def sharded_twin(planned: Mapping[Any, Any], key: Any) -> Any | None:
    """Under ``jax.jit`` the arguments are tracers; where their layout could not be read
    (:func:`laid_out`), a call whose leaves have no sharding takes the plan made for the
    same shapes on a mesh (by ``plan`` or a call on the arrays). ``planned``
    maps signatures (``static``; ``avals`` of shape, dtype, sharding) to plans."""
    if any(sharding is not None for *_, sharding in key.avals):
        return None
    for other, plan in planned.items():
        if other.static == key.static and [a[:2] for a in other.avals] == [a[:2] for a in key.avals]:
            return plan
    return None
