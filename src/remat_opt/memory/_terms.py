"""The terms of a segment's peak that the simulator and CP-SAT's encoding share.

Per buffer or per segment: what a recomputed unit writes
(:func:`remat_bytes`), the copies XLA makes of values stored in a transposed
layout (:func:`relayout_bytes`), what XLA keeps beyond the model where code
runs as written (:func:`tail_extra_bytes`) and the cotangents crossing a
boundary (:func:`boundary_cotangent_bytes`). :mod:`remat_opt.memory._simulate`
sums them into a prediction; :mod:`remat_opt.solve._encoding` encodes the same
sums for CP-SAT.
"""

from __future__ import annotations

from .._schedule import Schedule
from ..program._graph import ProgramGraph
from ._fusion import materialized


def kept_buffers(graph: ProgramGraph) -> frozenset[int]:
    """Buffers that some materialized value is laid over."""
    return frozenset(graph.buffer[v] for v in range(graph.num_nodes) if materialized(graph, v))


def remat_bytes(graph: ProgramGraph, unit: int, kept: frozenset[int]) -> int:
    """Bytes a recomputed unit adds to its segment's backward.

    A recomputation writes a new buffer (the stored copy, if any, is another
    one); aliases of it (``name``, reshapes) write none. The buffer counts when
    any value laid over it is materialized (``kept``, from :func:`kept_buffers`).
    """
    return sum(remat_buffer_sizes(graph, unit, kept))


def remat_buffer_sizes(graph: ProgramGraph, unit: int, kept: frozenset[int]) -> list[int]:
    """The sizes of the buffers a recomputed unit writes (see :func:`remat_bytes`)."""
    return [graph.node_bytes[v] for v in graph.units[unit].outputs if graph.buffer[v] == v and v in kept]


def rematerialized_buffers(
    graph: ProgramGraph, remat_sizes: dict[int, list[int]], seg_of: tuple[int, ...],
    live: dict[int, list[tuple[int, int]]] | None = None,
) -> dict[int, list[tuple[int, int]]]:
    """Per segment, the buffers its backward rematerializes (``remat_sizes``: per
    recomputed unit, its buffer sizes), as ``(position, bytes)``, except float32 upcasts of parameters (mixed precision), which no
    gradient slot hosts: crediting them under-predicted the bf16 MLP of
    tests/test_mixed_precision.py (docs/measurements.md, "Earlier model changes")."""
    from_inputs = [False] * graph.num_nodes  # computed from program inputs alone
    for unit in graph.units:
        for v in unit.outputs:
            from_inputs[v] = all(from_inputs[w] for w in unit.inputs)

    def upcast(u: int) -> bool:
        unit = graph.units[u]
        return unit.primitive == "convert_element_type" and all(from_inputs[v] for v in unit.outputs)

    out: dict[int, list[tuple[int, int]]] = {}
    for u, sizes in remat_sizes.items():
        if not upcast(u):
            position = graph.units[u].position
            out.setdefault(seg_of[position], []).extend((position, z) for z in sizes)
    for j, buffers in (live or {}).items():  # what is live together, where known (_branch)
        out[j] = [(graph.units[u].position, size) for u, size in buffers if not upcast(u)]
    return out


def relayout_bytes(
    graph: ProgramGraph, schedule: Schedule, seg_of: tuple[int, ...], segment: int, runs_as_written: bool
) -> int:
    """Bytes of the copies XLA makes at the start of a fenced segment's backward.

    A stored value laid out transposed (:attr:`ProgramGraph.transposed`) enters
    the backward's branch as an operand and is copied into the layout its
    readers want, once per reading position: values saved by name in the
    segment, and values crossing into it from earlier segments. A segment
    that runs as written (the last of its level) is not fenced and copies
    nothing.
    """
    if runs_as_written or not graph.transposed:
        return 0
    total = 0
    for v in range(graph.num_nodes):
        if not graph.transposed[v] or graph.is_output[v]:
            continue
        home = seg_of[graph.position_of(v)]
        if v in schedule.saved and home == segment:
            total += graph.node_bytes[v]
        readers = {graph.units[u].position for u in graph.consumers[v]}
        total += graph.node_bytes[v] * sum(1 for q in readers if seg_of[q] == segment > home)
    return total


def tail_extra_bytes(graph: ProgramGraph, buffer: int, names_in_slots: bool = False,
                     planning: bool = False) -> int:
    """What XLA keeps beyond the model for one residual buffer of code run as
    written (see :func:`remat_opt.memory._calibrate.calibrate`); 0 on an uncalibrated graph.
    With ``planning``, by the planning model's scale (:attr:`ProgramGraph.planning_scale`).

    A scale below 1 is XLA laying those residuals over gradient slots in the
    plain program. With ``names_in_slots`` (the prediction, in schedules that
    save names), the names take those slots (:func:`remat_opt.memory._slots.stored_in_slots`)
    and the scale counts as 1: crediting the names on top of the scale
    counts those slots twice (docs/measurements.md, "The schedule set",
    "Saved names in gradient slots" and "What did not work").
    """
    own = graph.planning_scale if planning else graph.plain_storage_scale
    scale = max(1.0, own) if names_in_slots else own
    return round((scale - 1.0) * graph.node_bytes[buffer])


def boundary_cotangent_bytes(graph: ProgramGraph, cut: int) -> int:
    """Cotangent bytes live across the boundary before position ``cut``."""
    return graph.crossing_bytes(cut) if cut < graph.num_positions else 0
