"""Chen's segmentations with a built-in policy's saves: the fenced per-layer plans users write.

A plan users write by hand, and one that does well on XLA once it is fenced,
is a checkpoint around each layer with ``dots_saveable`` (or
``dots_with_no_batch_dims_saveable``): each segment's backward recomputes its
elementwise work and keeps its matrix products. In remat_opt's terms that is
a segmentation whose saved names are the dots' outputs, and the rewriter
fences it like any schedule. These candidates put those saves on each of
Chen's segmentations (whose cuts fall between layers on a chain of layers),
so the planner measures them beside its own plans and never returns more
recompute than the best of them that fits.
"""

from __future__ import annotations

from ..program._graph import ProgramGraph
from ..program._names import parse_value_name
from .._schedule import Schedule
from ._chen import chen_schedules


def dot_names(graph: ProgramGraph, batch_dims: bool = True) -> frozenset[int]:
    """The name nodes of every ``dot_general`` output (with ``batch_dims=False``,
    only dots without batch dimensions, as ``dots_with_no_batch_dims_saveable``)."""
    eqns = graph.traced.jaxpr.jaxpr.eqns
    out = set()
    for unit in graph.units:
        parsed = parse_value_name(unit.name) if unit.primitive == "name" and unit.name else None
        if parsed is None:
            continue
        eqn = eqns[parsed[0]]
        if eqn.primitive.name != "dot_general":
            continue
        (_, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
        if batch_dims or not lhs_batch:
            out.add(unit.outputs[0])
    return frozenset(out)


def policy_schedules(graph: ProgramGraph, segmentations: tuple[Schedule, ...] | None = None) -> tuple[Schedule, ...]:
    """Each segmentation (by default, Chen's: :func:`remat_opt.solve._chen.chen_schedules`) with
    the dots' outputs saved, both ways; distinct, in order."""
    if segmentations is None:
        segmentations = chen_schedules(graph)
    variants = [dot_names(graph), dot_names(graph, batch_dims=False)]
    found: dict[Schedule, None] = {}
    for schedule in segmentations:
        if schedule.plain or schedule.nested or not schedule.cuts:
            continue
        for saved in variants:
            if saved:
                found[Schedule(cuts=schedule.cuts, saved=saved)] = None
    return tuple(found)
