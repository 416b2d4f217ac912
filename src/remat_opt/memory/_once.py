"""Stored values XLA:CPU must compute once: a conditional it cannot fuse reads each.

XLA's fusion pass duplicates cheap elementwise work into every reader, and it
decides per value whether it may (``InstructionFusion::ComputeGloballyUnfusible``):
a value computed from more than one full-size operand is duplicated unless one
of its direct readers cannot fuse it. A residual stream ``x1 = x0 + d1``,
``x2 = x1 + d2``, ... is such a chain. Where a plan saves names, ``jax.checkpoint``
hands its residuals to the backward through a one-operand ``reduce_precision``,
which XLA may duplicate too, so XLA rebuilds each stored stream value from the
branch outputs added into it (``x0 + d1 + d2 + ...``) in every fusion that
reads it, and keeps every branch output live until the last such fusion:
memory the plan never asked for (the zoo GPT's attention and MLP output
projections, at its forward peak).

:func:`computed_once` gives such a value a reader XLA cannot fuse: a
``lax.cond`` on a predicate it cannot fold whose branches return the value
(one through an optimization barrier, so the conditional survives; with two
identity branches XLA removes it). XLA then computes the value once, its
readers read that buffer, and the branch outputs die where the plan says.
The backward of :func:`computed_once` is the identity. Both branches are
free in FLOP counts (an earlier copy by two XORs an element was priced as
work, though it runs only when the first element is NaN).

With the stored values computed once, XLA's peak for the plans that save
names is lower or about the same; where a plan saves no names (Chen's
segmentations, Revolve) the same readers cost memory instead, so such plans
get none (:func:`once_values`). Figures: docs/measurements.md, "Stored
values computed once". On by default
(``optimize(..., compute_saved_once=False)`` turns it off). The memory model
counts the plans it applies to as XLA then runs them: the stored values held
once, each fenced branch's recomputation as XLA's breadth-first scheduler
leaves it live (:mod:`remat_opt.memory._branch`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from ._fusion import fused_sources, materialized
from ..program._graph import ProgramGraph
from ..program._names import parse_value_name
from .._schedule import Schedule, segment_of_positions

# Elementwise primitives of more than one operand: XLA duplicates their result
# into its readers unless a reader cannot fuse it.
MULTI_OPERAND_ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem", "nextafter",
    "select_n", "clamp",
})


def first_element(leaf: jax.Array) -> jax.Array:
    """``leaf``'s first element; on a mesh with explicit axes (sharding in types, where
    JAX cannot slice one element out of a sharded dim), the sum of its first entries
    along the unsharded dims: a scalar that still depends on every shard."""
    spec = tuple(getattr(getattr(jax.typeof(leaf), "sharding", None), "spec", ()) or ())
    sharded = [i < len(spec) and spec[i] is not None for i in range(jnp.ndim(leaf))]
    if not any(sharded):
        return jnp.ravel(leaf)[0]
    return jnp.sum(leaf[tuple(slice(None) if s else 0 for s in sharded)])


@jax.custom_vjp
def computed_once(x: jax.Array) -> jax.Array:
    """``x``, read by a conditional XLA:CPU cannot fuse, so XLA computes ``x`` once.

    Args:
        x: a floating-point array.

    Returns:
        ``x`` (the same values; its cotangent passes through unchanged).
    """
    first = first_element(x)
    return lax.cond(first == first, lambda y: y, lax.optimization_barrier, x)


computed_once.defvjp(lambda x: (computed_once(x), None), lambda _, ct: (ct,))


def _producer_duplicable(graph: ProgramGraph, node: int) -> bool:
    """Whether XLA may duplicate ``node``'s producer: an elementwise op whose
    distinct operands hold more elements than its result."""
    unit = graph.units[graph.node_unit[node]]
    if unit.primitive not in MULTI_OPERAND_ELEMENTWISE or not graph.node_bytes[node]:
        return False
    if "float" not in graph.node_dtype[node]:  # real floating point only (bfloat16 included)
        return False
    operands = {graph.buffer[w] for w in unit.inputs if graph.buffer[w] >= 0}
    return sum(math.prod(graph.node_shape[w]) for w in operands) > math.prod(graph.node_shape[node])


def stored_once(graph: ProgramGraph, schedule: Schedule) -> frozenset[int]:
    """The nodes :func:`computed_once` wraps under ``schedule``: the ``name``
    outputs of values the schedule stores (saved by name, read past their
    segment, or residuals of the last segment, which runs as written) that XLA
    would otherwise duplicate; none where the schedule saves no names, or nests.
    """
    if not schedule.saved or schedule.nested or schedule.plain:
        return frozenset()
    seg_of = segment_of_positions(graph.num_positions, schedule.all_cuts())
    last = seg_of[-1] if seg_of else 0
    stored = set(schedule.saved)
    for v in range(graph.num_nodes):
        seg = seg_of[graph.position_of(v)]
        if (any(seg_of[graph.units[u].position] > seg for u in graph.consumers[v])
                or (seg == last and materialized(graph, v))):
            stored.add(v)
    out = set()
    for v in stored:
        unit = graph.units[graph.node_unit[v]]
        if unit.name and parse_value_name(unit.name) is not None and _producer_duplicable(graph, unit.inputs[0]):
            out.add(v)
    return frozenset(out)


def once_values(graph: ProgramGraph, schedule: Schedule) -> frozenset[tuple[int, int]]:
    """The primal outputs ``(equation, output)`` :func:`computed_once` wraps under
    ``schedule`` (those of :func:`stored_once`)."""
    names = (graph.units[graph.node_unit[v]].name for v in stored_once(graph, schedule))
    return frozenset(parsed for name in names if name and (parsed := parse_value_name(name)) is not None)


def held_when_once(graph: ProgramGraph, schedule: Schedule) -> ProgramGraph:
    """``graph`` with the values XLA holds for fused residuals once ``schedule``'s
    stored values are computed once: a fused residual read from such a value is
    recomputed from it, not from its sources (:func:`remat_opt.memory._fusion.fused_sources`).
    ``graph`` itself where nothing is computed once."""
    once = stored_once(graph, schedule)
    if not once or not graph.held:
        return graph
    held = fused_sources(graph, graph.fused, once)
    return dataclasses.replace(graph, held=held)
