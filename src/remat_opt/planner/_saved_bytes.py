"""What the step-time search's saved values cost: the program priced by time on the device, and
the bytes saved values take, as the model counts them and as XLA's peak grows with them.

:func:`time_graph` prices each unit by its time at the device's ridge, and :func:`store_costs` each
value kept for the backward by the time of writing and reading it; :func:`layer_cost` adds both up
for a per-layer plan, to rank candidates before they are compiled; :func:`dot_bytes` and
:func:`layer_bytes` count the bytes a dot policy or a chosen saved set keeps;
:func:`xla_bytes_per_model_byte` scales them to XLA's measured peaks; :func:`saving_caps` are the byte
allowances, shares of what the budget leaves (:data:`CAP_SHARES`), in which saved values are chosen.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from ..memory._timing import device_ridge
from ..program._graph import ProgramGraph, build_graph
from ..program._cost import ELEMENTWISE_PRIMITIVES
from ..program._roofline import RooflineCostModel
from ..program._trace import TracedProgram
from ..solve._layers import Layers
from ..solve._policy_saves import dot_names
from ..solve._stage_saves import layer_stages, recomputed_units

CAP_SHARES = (1.0, 0.75, 0.5, 0.25)
"""The shares of the bytes a budget leaves in which the time model chooses saved values, one
candidate each (the same set twice is one candidate). The model prices a stored value's traffic
(:func:`store_costs`) but not the layout the compiler gives it: the device decides between them."""


def saving_caps(allowance: float) -> list[int]:
    """The bytes to choose saved values in: each share of :data:`CAP_SHARES` of ``allowance``
    (none when the budget leaves nothing)."""
    return [int(share * allowance) for share in CAP_SHARES] if allowance > 0 else []


def _ridge(traced: TracedProgram) -> float:
    """The default device's ridge for the program's matmul dtype."""
    dots = [e for e in traced.jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    return device_ridge(getattr(dots[0].invars[0].aval, "dtype", jax.numpy.float32) if dots else jax.numpy.float32)


def time_graph(traced: TracedProgram) -> ProgramGraph:
    """``traced``'s graph with each unit priced by its time when the backward runs it again on the
    default device (:class:`RooflineCostModel` at the device's ridge for the program's matmul
    dtype, ``rerun``: elementwise work fused into its reader costs its FLOPs alone; on a TPU the
    plans priced so fit the measured step times, docs/measurements.md, "Session 49")."""
    return build_graph(traced, RooflineCostModel(_ridge(traced), rerun=True))


def store_cost(graph: ProgramGraph, v: int, ridge: float) -> int:
    """What keeping value ``v`` for the backward costs, in FLOP-equivalents at ``ridge``: reading it
    back, and, for the output of an elementwise equation (which XLA fuses into its readers unless
    it is kept), writing it too. A name equation's output is priced as the value it names."""
    unit = graph.units[graph.node_unit[v]]
    while unit.primitive == "name" and unit.inputs:
        unit = graph.units[graph.node_unit[unit.inputs[0]]]
    passes = 2 if unit.primitive in ELEMENTWISE_PRIMITIVES else 1
    return round(passes * ridge * graph.node_bytes[v])


def store_costs(graph: ProgramGraph) -> dict[int, int]:
    """:func:`store_cost` of every value a names policy can save (a name equation's output), on a
    :func:`time_graph`."""
    ridge = _ridge(graph.traced)
    return {u.outputs[0]: store_cost(graph, u.outputs[0], ridge) for u in graph.units
            if u.primitive == "name" and u.outputs}


def policy_saves(graph: ProgramGraph, policy: object) -> frozenset[int] | None:
    """What a stage under ``policy`` (a :data:`remat_opt.rewrite._layers.StagePolicy`) saves, as
    nodes of ``graph`` (those of every stage; :func:`layer_cost` keeps each stage's own), or
    ``None`` for a stage as written."""
    if policy is None:
        return None
    if isinstance(policy, tuple) or policy == "everything_saveable":
        names = set(policy) if isinstance(policy, tuple) else None
        return frozenset(u.outputs[0] for u in graph.units if u.primitive == "name" and u.outputs
                         and (names is None or u.name in names))
    if policy in ("dots_saveable", "dots_with_no_batch_dims_saveable"):
        return dot_names(graph, batch_dims=policy == "dots_saveable")
    return frozenset()


def layer_cost(graph: ProgramGraph, layers: Layers, saved: Sequence[frozenset[int] | None]) -> int:
    """A per-layer plan's time on a :func:`time_graph`, in FLOP-equivalents, beyond what every plan
    pays: per layer, the units it runs again and the values it keeps (:func:`store_cost`, each
    buffer once), where ``saved[k]`` is what layer ``k`` saves under a checkpoint, or ``None`` for
    a layer as written (it keeps its residuals and runs nothing again)."""
    ridge, total = _ridge(graph.traced), 0
    for stage, kept in zip(layer_stages(graph, layers), saved):
        own = {v for x in stage.units for v in graph.units[x].outputs if v not in stage.exits}
        if kept is None:
            kept = frozenset(v for v in own if graph.residual[v])
        else:
            kept = frozenset(kept) & own
            total += sum(graph.units[x].flops for x in recomputed_units(graph, stage, kept) if x in graph.primal)
        buffers = {graph.buffer[v]: v for v in sorted(kept) if graph.buffer[v] >= 0}
        total += sum(store_cost(graph, v, ridge) for v in buffers.values())
    return total


def dot_bytes(graph: ProgramGraph, spans: Sequence[tuple[int, int]] | None = None) -> dict[str, int]:
    """Bytes of the values each per-layer dot policy saves, on ``graph`` (within ``spans``, or all)."""
    out = {}
    for policy, batch_dims in (("dots_saveable", True), ("dots_with_no_batch_dims_saveable", False)):
        buffers = {graph.buffer[v] for v in dot_names(graph, batch_dims)
                   if spans is None or any(lo <= graph.position_of(v) < hi for lo, hi in spans)}
        out[policy] = sum(graph.node_bytes[b] for b in buffers)
    return out


def layer_bytes(graph: ProgramGraph, layers: Layers, saved: frozenset[int]) -> list[int]:
    """Per layer, the bytes of the values of ``saved`` it makes (each buffer once)."""
    buffers: list[set[int]] = [set() for _ in range(layers.count)]
    spans = layers.spans()
    for v in saved:
        k = next((k for k, (lo, hi) in enumerate(spans) if lo <= graph.position_of(v) < hi), None)
        if k is not None:
            buffers[k].add(graph.buffer[v])
    return [sum(graph.node_bytes[b] for b in bs if b >= 0) for bs in buffers]


def xla_bytes_per_model_byte(model_bytes: dict[str, int], peaks: dict[str, int | None], least_peak: int) -> float:
    """What XLA's peak grows by per byte the model saves, read off the measured dot policies against
    the least-memory one (``peaks``; ``model_bytes`` what each saves, all layers or iterations
    counted); 1 where none was measured; within [0.5, 4]."""
    ratios = [(model_bytes[p], (peak - least_peak) / model_bytes[p])
              for p, peak in peaks.items() if peak is not None and model_bytes.get(p, 0) > 0]
    return min(4.0, max(0.5, max(ratios)[1])) if ratios else 1.0
