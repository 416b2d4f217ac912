"""What the step-time search's saved values cost: the program priced by time on the device, and
the bytes saved values take, as the model counts them and as XLA's peak grows with them.

:func:`time_graph` prices each unit by its time at the device's ridge; :func:`dot_bytes` and
:func:`layer_bytes` count the bytes a dot policy or a chosen saved set keeps;
:func:`xla_bytes_per_model_byte` scales them to XLA's measured peaks; :func:`saving_caps` are the byte
allowances, shares of what the budget leaves (:data:`CAP_SHARES`), in which saved values are chosen.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from ..memory._timing import device_ridge
from ..program._graph import ProgramGraph, build_graph
from ..program._roofline import RooflineCostModel
from ..program._trace import TracedProgram
from ..solve._layers import Layers
from ..solve._policy_saves import dot_names

CAP_SHARES = (1.0, 0.75, 0.5, 0.25)
"""The shares of the bytes a budget leaves in which the time model chooses saved values, one
candidate each. Saving more is not always faster on the device (a stored value is written and read
back, in a layout the compiler picks), which the model does not price: the device decides."""


def saving_caps(allowance: float) -> list[int]:
    """The bytes to choose saved values in: each share of :data:`CAP_SHARES` of ``allowance``
    (none when the budget leaves nothing)."""
    return [int(share * allowance) for share in CAP_SHARES] if allowance > 0 else []


def time_graph(traced: TracedProgram) -> ProgramGraph:
    """``traced``'s graph with each unit priced by its time on the default device
    (:class:`RooflineCostModel` at the device's ridge for the program's matmul dtype)."""
    dots = [e for e in traced.jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    dtype = getattr(dots[0].invars[0].aval, "dtype", jax.numpy.float32) if dots else jax.numpy.float32
    return build_graph(traced, RooflineCostModel(device_ridge(dtype)))


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
