"""The memory model: peak bytes and recompute FLOPs of a schedule, simulated.

This is the independent check of every plan (Checkmate kept one for the same
reason): it recomputes, from the graph and the decisions alone, what the
rewritten program stores, recomputes and holds at its peak, trusting nothing
the solver said. The CP-SAT model in :mod:`remat_opt._solve` encodes exactly
these rules; tests hold the two equal on every plan and equal to brute force.

Execution model (the one the rewriter enforces, FINDINGS §2): the forward runs
the whole program; each segment's backward then runs, last segment first,
fenced so that it starts only once its cotangent exists. Inside a segment's
backward every recomputed residual is materialized at once, then transposed.
The peak during the backward of segment J is

    inputs + outputs                       (arguments, primal outputs, gradients: all
                                            of them, though XLA writes a gradient only
                                            when it is computed; the slack stands in
                                            for XLA's heap fragmentation, which the
                                            model does not simulate)
  + stored values live at J                (saved names of segments <= J, boundary
                                            values whose first reader outside their
                                            own segment is in a segment <= J)
  + recomputed residuals of J
  + relayout copies of J                   (stored values in a transposed layout that
                                            J's backward reads: XLA copies each one
                                            into row-major when the branch starts)
  + cotangents crossing J's end boundary
  + the largest transient of J             (one cotangent and one operand in flight)

and the plan's peak is the largest over segments. A program without remat
(``plain``) stores every residual and recomputes nothing.

The last segment is always plain: its backward runs right after its forward,
so recomputing it would hold the same residuals at the same moment and only
cost FLOPs (and XLA:CPU merges such a recomputation back into the forward by
CSE when it can). Its residuals are stored from where they are computed and
count in its own peak only; the rewriter runs it unwrapped. Code that runs as
written is where XLA's fusion strays furthest from the model, so those bytes
are scaled by a factor fitted to XLA's peak for the plain program
(:func:`calibrate`, measured by every ``optimize`` call anyway).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ._graph import ProgramGraph


@dataclass(frozen=True)
class Schedule:
    """Decisions: where segments start and which values are saved by name.

    Attributes:
        cuts: positions (primal equation indices) at which a new segment starts.
        saved: node ids saved by name (``name`` units only).
        plain: no remat at all; the program as the user wrote it.
    """

    cuts: frozenset[int] = frozenset()
    saved: frozenset[int] = frozenset()
    plain: bool = False


@dataclass(frozen=True)
class Simulation:
    """What the model predicts for a schedule."""

    peak_bytes: int
    recompute_flops: int
    recomputed_units: frozenset[int]
    stored_nodes: frozenset[int]
    segment_peaks: tuple[int, ...]
    segment_of_position: tuple[int, ...]


def segment_of_positions(num_positions: int, cuts: frozenset[int]) -> tuple[int, ...]:
    seg, out = 0, []
    for p in range(num_positions):
        if p in cuts and p > 0:
            seg += 1
        out.append(seg)
    return tuple(out)


def transient_bytes(graph: ProgramGraph, unit: int) -> int:
    """In-flight bytes while one unit is transposed: its largest output (XLA:CPU
    writes most cotangents in place of a dead operand, so one, not two)."""
    return max((graph.node_bytes[v] for v in graph.units[unit].outputs), default=0)


def materialized(graph: ProgramGraph, node: int) -> bool:
    """Whether a residual gets a buffer of its own (XLA fuses the cheap ones away)."""
    return graph.residual[node] and not (graph.fused and graph.fused[node])


def kept_buffers(graph: ProgramGraph) -> frozenset[int]:
    """Buffers that some materialized value is laid over."""
    return frozenset(graph.buffer[v] for v in range(graph.num_nodes) if materialized(graph, v))


def remat_bytes(graph: ProgramGraph, unit: int, kept: frozenset[int]) -> int:
    """Bytes a recomputed unit adds to its segment's backward.

    A recomputation writes a new buffer (the stored copy, if any, is another
    one); aliases of it (``name``, reshapes) write none. The buffer counts when
    any value laid over it is materialized (``kept``, from :func:`kept_buffers`).
    """
    return sum(graph.node_bytes[v] for v in graph.units[unit].outputs if graph.buffer[v] == v and v in kept)


def relayout_bytes(graph: ProgramGraph, schedule: Schedule, seg_of: tuple[int, ...], segment: int) -> int:
    """Bytes of the copies XLA makes at the start of a fenced segment's backward.

    A stored value laid out transposed (:attr:`ProgramGraph.transposed`) enters
    the backward's branch as an operand and is copied into the layout its
    readers want, once per reading position: values saved by name in the
    segment, and values crossing into it from earlier segments. The last
    segment is not fenced and copies nothing.
    """
    if segment == max(seg_of, default=0) or not graph.transposed:
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


def tail_extra_bytes(graph: ProgramGraph, buffer: int) -> int:
    """What XLA keeps beyond the model for one residual buffer of code run as
    written (see :func:`calibrate`); 0 on an uncalibrated graph."""
    return round((graph.plain_storage_scale - 1.0) * graph.node_bytes[buffer])


def calibrate(graph: ProgramGraph, plain_peak_bytes: int) -> ProgramGraph:
    """The graph with its plain-storage scale fitted to XLA's peak for the plain program.

    Code that runs as written (the plain program, and every plan's last
    segment) is where XLA's fusion differs most from the model: it keeps the
    operands of cheap values it fuses into their readers (the attention
    scores behind a softmax, the matmul outputs behind a residual stream) on
    top of the residuals. Measuring the plain program is part of every plan
    anyway; its error, spread over the residual bytes the model stores for
    it, scales those bytes wherever code runs as written. Clamped to [0.5, 2].

    Args:
        graph: the program graph (uncalibrated).
        plain_peak_bytes: XLA's peak for the program as written.

    Returns:
        ``graph`` with ``plain_storage_scale`` set.
    """
    graph = dataclasses.replace(graph, plain_storage_scale=1.0)
    sim = simulate(graph, Schedule(plain=True))
    stored = sum(graph.node_bytes[b] for b in {graph.buffer[v] for v in sim.stored_nodes} if b >= 0)
    if stored == 0:
        return graph
    scale = 1.0 + (plain_peak_bytes - sim.peak_bytes) / stored
    return dataclasses.replace(graph, plain_storage_scale=min(2.0, max(0.5, scale)))


def boundary_cotangent_bytes(graph: ProgramGraph, cut: int) -> int:
    """Cotangent bytes live across the boundary before position ``cut``."""
    return graph.crossing_bytes(cut) if cut < graph.num_positions else 0


def simulate(graph: ProgramGraph, schedule: Schedule) -> Simulation:
    """Predicts peak bytes and recompute FLOPs of ``schedule`` on ``graph``."""
    seg_of = segment_of_positions(graph.num_positions, schedule.cuts)
    units = graph.units
    node_seg = [seg_of[graph.position_of(v)] for v in range(graph.num_nodes)]
    num_segments = (max(seg_of) + 1) if seg_of else 1

    # Values crossing a segment boundary are stored from their first reader outside.
    crossing: dict[int, int] = {}
    for v in range(graph.num_nodes):
        if graph.is_output[v] or schedule.plain:
            continue
        outside = [units[u].position for u in graph.consumers[v] if seg_of[units[u].position] > node_seg[v]]
        if outside:
            crossing[v] = min(outside)

    # The last segment is plain: its residuals are stored where they are computed.
    last = num_segments - 1
    tail = {v for v in range(graph.num_nodes) if graph.residual[v] and node_seg[v] == last}

    # Recompute closure: residuals not stored are recomputed, with what they read.
    recomputed: set[int] = set()
    if not schedule.plain:
        available = set(crossing) | set(schedule.saved) | tail
        stack = [graph.node_unit[v] for v in range(graph.num_nodes) if graph.residual[v] and v not in available]
        while stack:
            u = stack.pop()
            if u in recomputed:
                continue
            recomputed.add(u)
            stack.extend(graph.node_unit[w] for w in units[u].inputs if w not in available)

    # A saved name is stored only if the backward reads it (JAX saves residuals only).
    live_from = dict(crossing)
    if schedule.plain:
        live_from = {v: graph.position_of(v) for v in range(graph.num_nodes) if materialized(graph, v) and not graph.is_output[v]}
    else:
        read = {w for u in recomputed for w in units[u].inputs}
        for v in schedule.saved:
            if graph.residual[v] or v in read:
                live_from[v] = graph.position_of(v)
        for v in tail:
            if materialized(graph, v) and not graph.is_output[v]:
                live_from.setdefault(v, graph.position_of(v))

    def buffer_bytes(nodes: object) -> int:
        """Bytes of the distinct buffers behind ``nodes`` (aliases counted once)."""
        return sum(graph.node_bytes[b] for b in {graph.buffer[v] for v in nodes} if b >= 0)

    tail_buffers = {
        b for b in {graph.buffer[v] for v in range(graph.num_nodes)
                    if graph.residual[v] and materialized(graph, v) and not graph.is_output[v]}
        if b >= 0 and node_seg[b] == last
    }
    base = graph.input_bytes + graph.output_bytes
    kept = kept_buffers(graph)
    seg_end = [max(p for p in range(graph.num_positions) if seg_of[p] == j) for j in range(num_segments)]
    peaks = []
    for j in range(num_segments):
        stored_nodes = [v for v, p in live_from.items() if p <= seg_end[j]]
        stored = buffer_bytes(stored_nodes)
        rematerialized = sum(remat_bytes(graph, u, kept) for u in recomputed if seg_of[units[u].position] == j)
        rematerialized += relayout_bytes(graph, schedule, seg_of, j)
        if j == last:
            rematerialized += sum(tail_extra_bytes(graph, b) for b in tail_buffers)
        transient = max((transient_bytes(graph, u.index) for u in units if seg_of[u.position] == j), default=0)
        peaks.append(base + stored + rematerialized + transient + boundary_cotangent_bytes(graph, seg_end[j] + 1))
    return Simulation(
        peak_bytes=max(peaks),
        recompute_flops=sum(units[u].flops for u in recomputed & graph.primal),
        recomputed_units=frozenset(recomputed),
        stored_nodes=frozenset(live_from),
        segment_peaks=tuple(peaks),
        segment_of_position=seg_of,
    )
