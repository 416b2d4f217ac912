"""The memory model: peak bytes and recompute FLOPs of a schedule, simulated.

This is the independent check of every plan (Checkmate kept one for the same
reason): it recomputes, from the graph and the decisions alone, what the
rewritten program stores, recomputes and holds at its peak, trusting nothing
the solver said. The CP-SAT model in :mod:`remat_opt.solve._encoding` encodes exactly
these rules; tests hold the two equal on every plan and equal to brute force.

Execution model (the one the rewriter enforces, docs/xla_findings.md §2): the forward runs
the whole program; each segment's backward then runs, last segment first,
fenced so that it starts only once its cotangent exists. Inside a segment's
backward every recomputed residual is materialized at once, then transposed
(CP-SAT plans with that count; the prediction counts what XLA:CPU's
breadth-first scheduler leaves live at once, :mod:`remat_opt.memory._branch`).
The peak during the backward of segment J is

    inputs + outputs                       (arguments, primal outputs, gradients: all
                                            of them, though XLA writes a gradient only
                                            when it is computed; the slack stands in
                                            for XLA's heap fragmentation, which the
                                            model does not simulate)
  + stored values live at J                (saved names of segments <= J, boundary
                                            values whose first reader outside their
                                            own segment is in a segment <= J; in the
                                            prediction, whose backward reads them)
  - stored values in gradient slots        (values XLA lays over the output buffer,
                                            as large or larger, of a gradient not yet
                                            written; in schedules that save names,
                                            from a segment later: :mod:`remat_opt.memory._slots`)
  + recomputed residuals of J
  - recomputed residuals in gradient slots (those the stored values leave free, read
                                            before J, or a matmul weight's read
                                            before the residual, in the prediction)
  + relayout copies of J                   (stored values in a transposed layout that
                                            J's backward reads: XLA copies each one
                                            into row-major when the branch starts)
  + cotangents crossing J's end boundary
  + the largest transient of J             (one cotangent and one operand in flight; in
                                            the prediction of the step's last segment,
                                            net of the residuals its backward has freed
                                            by then: :func:`remat_opt.memory._transient.as_written_transient`)

and the plan's peak is the largest over segments and, in the prediction of a
flat plan, over its forward too, where parallel branches' values wait side by
side (:mod:`remat_opt.memory._forward`). A program without remat
(``plain``) stores every residual and recomputes nothing.

The last segment is always plain: its backward runs right after its forward,
so recomputing it would hold the same residuals at the same moment and only
cost FLOPs (and XLA:CPU merges such a recomputation back into the forward by
CSE when it can). Its residuals are stored from where they are computed and
count in its own peak only; the rewriter runs it unwrapped. Code that runs as
written is where XLA's fusion strays furthest from the model, so those bytes
are scaled by a factor fitted to XLA's peak for the plain program
(:func:`remat_opt.memory._calibrate.calibrate`, measured by every ``optimize`` call anyway).

CP-SAT plans with a narrower slot credit (``simulate(planning=True)``, which
:mod:`remat_opt.solve._encoding` encodes exactly): only values stored across a cut, in
slots of their own size, and none in schedules that save names. The
prediction follows XLA's buffer assigner more closely
(:func:`remat_opt.memory._slots.assign_stored_buffers`: values stored across a cut
and saved names, each once for the whole step, in any slot as large; then a
fenced segment's rematerialized buffers in the slots left free:
:func:`remat_opt.memory._slots.predicted_slot_credit`).

Known gaps, read off XLA's buffer assignment and not modelled yet: XLA's
assignment is global and also places temporaries the model does not list
(weight relayouts, cotangents), so the slot credit is approximate (its
error on the zoo's measured schedules, ``experiments/schedule_fidelity.py``:
docs/measurements.md, "The schedule set"). A cut just before an
elementwise op whose input then crosses costs one activation more than
modelled. The forward is counted only as XLA:CPU's breadth-first order
runs it (:mod:`remat_opt.memory._forward`), where XLA can peak higher: its fusions
recompute a residual stream from the branch outputs added into it
(``x0 + d1 + d2 + ...``) instead of reading the stream, so every branch
output stays live until the last such fusion. Where XLA ends such a chain
is its fusion pass's choice, not the graph's, so charging whole chains
fixes some plans and over-predicts others (docs/measurements.md, "The
Pareto sweep's plans"). XLA's fusion log shows what ends a chain: not its
15-copy duplication cap but its rule that a value with more than one
full-size operand is computed once when a direct reader cannot fuse it (a
backward conditional reading it raw). Whether a residual reaches the
conditional raw or through the ``reduce_precision`` ``jax.checkpoint``
puts on residuals its segment also reads, and what XLA's passes leave of
that, the schedule does not tell.
:mod:`remat_opt.memory._once` uses that rule to end the chains of plans that
save names (``optimize``'s default), which the model then counts as written:
in those plans, the prediction lays the last
segment's residuals over gradient slots too
(:func:`remat_opt.memory._slots.stored_in_slots`), and holds no source of a fused
residual that reads a value computed once (:func:`remat_opt.memory._once.held_when_once`).

Nested schedules (:attr:`Schedule.nested`, built by :mod:`remat_opt.solve._nesting`)
follow the same rules on the segments of every level at once: a nested
segment's backward reruns its forward, storing what its own level stores
(values crossing its inner cuts, its last inner segment's residuals), then
runs its inner segments' backwards, last first. A stored value is live from
its first reader outside its segment until the backward of the innermost
level holding both is over. The CP-SAT model encodes flat schedules only;
nested ones are simulated here and measured.
"""

from __future__ import annotations

import dataclasses

from ._branch import live_per_segment
from ._forward import forward_peak_bytes, runs_branches_side_by_side
from ._terms import (
    boundary_cotangent_bytes,
    kept_buffers,
    rematerialized_buffers,
    relayout_bytes,
    remat_buffer_sizes,
    tail_extra_bytes,
)
from ._fusion import materialized, read_by_backward
from ..program._graph import ProgramGraph, per_graph
from ._once import held_when_once
from ._partials import held_partial_bytes
from .._schedule import Schedule, Simulation, nested_ranges, segment_of_positions
from ._transient import held_forward_scratch, segment_transients
from ._slots import (
    ScheduleSlots,
    gradient_slots,
    matmul_slots,
    predicted_slot_credit,
    segment_slots,
    slot_candidates,
    slot_credit,
    stored_in_slots,
)

def _read_copies(
    graph: ProgramGraph, copies: list[tuple[int, int, int, int]], recomputed: set[int],
    seg_of: tuple[int, ...], node_seg: tuple[int, ...],
) -> list[tuple[int, int, int, int]]:
    """The top level's values stored across a cut, from the first segment whose
    backward reads them (the prediction, in schedules without nesting).

    A segment may recompute nothing that reads a value crossing into it (one
    that saves names, or one whose code has no residual to recompute), and
    no transpose reads a value that is not a residual: JAX then keeps no
    residual for it, and the value dies in the forward (XLA holds none of
    the stream values crossing into such segments: the small test GPT's
    plan at 0.85 of its plain peak, Chen's sqrt(n) segmentation of the zoo
    GPT). Not with nesting: a nested segment's backward reruns its forward,
    which reads them. Figures: docs/measurements.md, "The schedule set".

    Nor where its own segment's recomputation reads it (a sine's cosine, from
    its input): a segment output is saved by name, and JAX keeps it to that
    segment's backward. Counted from its first reader outside its segment, as
    CP-SAT's encoding counts a crossing value (XLA holds it in the segments
    between too; left out, the prediction stays at or under the planning
    model's). Found on a value read in its segment and, past two cuts, only
    by an add (``tests/test_stored.py``), and on Chen's segmentation of the
    fresh ``associative_scan`` (docs/measurements.md, "Fresh programs: a
    second evaluation set").
    """
    residual_buffers = {graph.buffer[v] for v in range(graph.num_nodes) if read_by_backward(graph, v)}
    readers: dict[int, set[int]] = {}  # buffer -> segments whose recomputation reads it
    for u in recomputed:
        for w in graph.units[u].inputs:
            readers.setdefault(graph.buffer[w], set()).add(seg_of[graph.units[u].position])
    out = []
    for v, level, first, last in copies:
        b = graph.buffer[v]
        if level == 0 and first > node_seg[v] and b >= 0 and b not in residual_buffers:
            reading = [j for j in readers.get(b, ()) if first <= j <= last]
            if not reading and node_seg[v] not in readers.get(b, ()):
                continue
            first = min(reading, default=first)
        out.append((v, level, first, last))
    return out


_simulations: dict[int, dict[tuple[Schedule, bool], Simulation]] = {}
"""Per live graph (by id, dropped with it): the simulations made on it. The
planner asks for the same schedule many times (a Chen segmentation, by every
solve and every tier), and a simulation is a function of the two."""


def simulate(graph: ProgramGraph, schedule: Schedule, *, planning: bool = False) -> Simulation:
    """Predicts peak bytes and recompute FLOPs of ``schedule`` on ``graph``
    (:func:`simulated`), once per graph, schedule and ``planning``."""
    made = per_graph(_simulations, graph, dict)
    key = (schedule, planning)
    if key not in made:
        made[key] = simulated(graph, schedule, planning=planning)
    return made[key]


def simulated(graph: ProgramGraph, schedule: Schedule, *, planning: bool = False,
              gross_transient: bool = False) -> Simulation:
    """Predicts peak bytes and recompute FLOPs of ``schedule`` on ``graph``.

    With ``planning``, the model CP-SAT plans with (:mod:`remat_opt.solve._encoding`
    encodes exactly it): the same, except for the gradient-slot credit,
    which is narrower (see the module docstring). The prediction's rules
    are approximate, and as constraints they steered CP-SAT to plans XLA
    measured over their prediction (with names saved: the demo GPT's
    tighter budgets; docs/measurements.md, "Earlier model changes"): an
    optimizer seeks out where a model errs low. Planned without them, plans are over-predicted
    rather than under (see :func:`remat_opt.memory._slots.segment_slots` for the figures).

    Nesting (``schedule.nested``) is simulated on the segments of every level
    at once: each backward step runs on one of them. A value crossing a cut is
    stored from its first reader outside its segment, by the innermost level
    holding both, and stays live until that level's backward is over; the
    last segment of every level runs as written; a nested segment's backward
    first recomputes what its own level stores, then runs its segments'
    backwards in reverse.

    A value read past its segment only by the last segment of its level is
    not stored for that segment (which runs as written and does not read it
    in its backward), but the rewriter saves every segment output by name,
    so its own segment's recomputation reads it instead of recomputing it,
    and then JAX keeps it, like a saved name, until that segment's backward.

    With ``gross_transient``, the prediction charges the step's last segment its
    whole largest transient, as the planning model does (the prediction nets it:
    :func:`remat_opt.memory._transient.as_written_transient`); calibration fits
    the planning model's scale with it (:func:`remat_opt.memory._calibrate.calibrate`).
    """
    if not planning:
        graph = held_when_once(graph, schedule)
    run = _Run(graph, schedule, _Layout.of(graph, schedule), planning, not (planning or gross_transient))
    copies, outputs_only, residual_as_written = _stored_copies(run)
    recomputed: set[int] = set()
    if not schedule.plain:
        recomputed, copies = _recomputed(run, copies, outputs_only, residual_as_written)
    rerun, rerun_flops = _rerun(graph, run.layout, copies, residual_as_written)
    flops = sum(graph.units[u].flops for u in recomputed & graph.primal) + rerun_flops
    peaks, partials_at_end = _segment_peaks(run, copies, recomputed, rerun)
    peak = max(*peaks, graph.input_bytes + graph.output_bytes + partials_at_end)
    if not planning and not schedule.plain and not schedule.nested and runs_branches_side_by_side():
        # the prediction's forward, where XLA runs branches side by side (_forward)
        peak = max(peak, forward_peak_bytes(graph, {graph.buffer[c[0]] for c in copies}))
    return Simulation(
        peak_bytes=peak,
        recompute_flops=flops,
        recomputed_units=frozenset(recomputed | rerun),
        stored_nodes=frozenset(c[0] for c in copies),
        segment_peaks=tuple(peaks),
        segment_of_position=run.layout.seg_of,
    )


Copy = tuple[int, int, int, int]
"""A stored copy: (node, the level that stores it, the first and last segment it is live at)."""


@dataclasses.dataclass(frozen=True)
class _Layout:
    """A schedule's segments on a graph: per position and node, its segment; per
    level (the whole program first, then each nested segment), its range of
    positions and of segments."""

    ranges: tuple[tuple[int, int], ...]
    seg_of: tuple[int, ...]
    node_seg: tuple[int, ...]
    num_segments: int
    levels: tuple[tuple[int, int], ...]
    as_written: frozenset[int]
    """The last segment of each level, which runs as written."""
    starts: tuple[int, ...]
    """Per segment, its first position."""

    @classmethod
    def of(cls, graph: ProgramGraph, schedule: Schedule) -> _Layout:
        ranges = nested_ranges(schedule, graph.num_positions)
        seg_of = segment_of_positions(graph.num_positions, schedule.all_cuts())
        levels = tuple((seg_of[lo], seg_of[hi - 1]) if hi > lo else (0, 0) for lo, hi in ranges)
        starts = (0, *sorted(c for c in schedule.all_cuts() if 0 < c < graph.num_positions))
        return cls(ranges, seg_of, tuple(seg_of[graph.position_of(v)] for v in range(graph.num_nodes)),
                   (max(seg_of) + 1) if seg_of else 1, levels, frozenset(last for _, last in levels), starts)

    def innermost(self, first: int, last: int) -> int:
        """The innermost level holding segments ``first`` to ``last``."""
        return max(i for i, (lo, hi) in enumerate(self.levels) if lo <= first and last <= hi)


@dataclasses.dataclass(frozen=True)
class _Run:
    """One simulation: the graph (with what XLA holds once the schedule's stored values
    are computed once, in the prediction), the schedule, its layout on the graph, and
    whether it is the model CP-SAT plans with (else the prediction), and whether the
    step's last segment's transient is net of the residuals freed by then (the prediction's)."""

    graph: ProgramGraph
    schedule: Schedule
    layout: _Layout
    planning: bool
    net_transient: bool


def _stored_copies(run: _Run) -> tuple[list[Copy], list[tuple[int, int]], list[int]]:
    """The copies the schedule stores (values crossing a cut, the residuals of code run
    as written); the segment outputs read only by their level's last segment, as
    ``(node, level)`` (not stored for it, but saved by name for their own segment: the
    rewriter names every output); and the residual nodes of code run as written."""
    graph, schedule, layout = run.graph, run.schedule, run.layout
    node_seg, as_written = layout.node_seg, layout.as_written
    residual_as_written = [v for v in range(graph.num_nodes) if graph.residual[v] and node_seg[v] in as_written]
    if schedule.plain:
        copies = [(v, 0, 0, 0) for v in range(graph.num_nodes) if materialized(graph, v) and not graph.is_output[v]]
        return copies, [], residual_as_written
    copies, outputs_only = [], []
    for v in range(graph.num_nodes):
        if graph.is_output[v]:
            continue
        first_reader: dict[int, int] = {}
        for r in {layout.seg_of[graph.units[u].position] for u in graph.consumers[v]}:
            if r > node_seg[v]:
                level = layout.innermost(node_seg[v], r)
                first_reader[level] = min(first_reader.get(level, r), r)
        # Into the last segment of a level, which runs as written, a value is
        # kept only if that segment's backward reads it; else it dies in the forward.
        for level, r in first_reader.items():
            if r != layout.levels[level][1] or read_by_backward(graph, v):
                copies.append((v, level, r, layout.levels[level][1]))
            else:
                outputs_only.append((v, level))
    # Code that runs as written stores its residuals (and held sources) where they are computed.
    copies += [(v, layout.innermost(node_seg[v], node_seg[v]), node_seg[v], node_seg[v])
               for v in range(graph.num_nodes)
               if node_seg[v] in as_written and materialized(graph, v) and not graph.is_output[v]]
    return copies, outputs_only, residual_as_written


def _recomputed(run: _Run, copies: list[Copy], outputs_only: list[tuple[int, int]],
                residual_as_written: list[int]) -> tuple[set[int], list[Copy]]:
    """The units fenced segments recompute (the residuals not stored, and what they
    read: the same every time their backward runs), and the copies with the saved
    names and segment outputs that recomputation reads."""
    graph, schedule, layout = run.graph, run.schedule, run.layout
    node_seg, units = layout.node_seg, graph.units
    available = {c[0] for c in copies} | set(schedule.saved) | set(residual_as_written)
    available |= {v for v, _ in outputs_only}
    if any(layout.innermost(node_seg[v], node_seg[v]) > 0 for v in schedule.saved):
        raise ValueError("names are saved only in segments that are not nested")
    recomputed: set[int] = set()
    stack = [graph.node_unit[v] for v in range(graph.num_nodes) if graph.residual[v] and v not in available]
    while stack:
        u = stack.pop()
        if u in recomputed:
            continue
        recomputed.add(u)
        stack.extend(graph.node_unit[w] for w in units[u].inputs if w not in available)
    # A saved name is stored only if the backward reads it (JAX saves residuals only).
    read = {w for u in recomputed for w in units[u].inputs}
    copies = copies + [(v, 0, node_seg[v], layout.num_segments - 1) for v in schedule.saved
                       if graph.residual[v] or v in read]
    copies += [(v, level, node_seg[v], layout.levels[level][1]) for v, level in outputs_only if v in read]
    if not run.planning and not schedule.nested:
        copies = _read_copies(graph, copies, recomputed, layout.seg_of, node_seg)
    return recomputed, copies


def _rerun(graph: ProgramGraph, layout: _Layout, copies: list[Copy],
           residual_as_written: list[int]) -> tuple[set[int], int]:
    """The units nested segments' backwards rerun, and their FLOPs (once per level
    that reruns them): each first reruns its forward for what its level stores
    (values crossing its inner cuts, and its last inner segment's residuals)."""
    rerun: set[int] = set()
    flops = 0
    for level, (lo, _) in enumerate(layout.ranges[1:], start=1):
        stack = [graph.node_unit[v] for v, at, _, _ in copies if at == level]
        stack += [graph.node_unit[v] for v in residual_as_written if layout.node_seg[v] == layout.levels[level][1]]
        done: set[int] = set()
        while stack:
            u = stack.pop()
            if u in done:
                continue
            done.add(u)
            stack.extend(graph.node_unit[w] for w in graph.units[u].inputs if graph.position_of(w) >= lo)
        flops += sum(graph.units[u].flops for u in done & graph.primal)
        rerun |= done
    return rerun, flops


def _segment_peaks(run: _Run, copies: list[Copy], recomputed: set[int], rerun: set[int]) -> tuple[list[int], int]:
    """Per segment, the peak of its backward (the sum in the module docstring); and
    the gradient partials XLA holds to the end of the step (:mod:`remat_opt.memory._partials`)."""
    graph, schedule, layout = run.graph, run.schedule, run.layout
    seg_of, num_segments, as_written = layout.seg_of, layout.num_segments, layout.as_written
    # Per segment, in one pass each: the distinct buffers stored (aliases counted
    # once), what its backward rematerializes, and its largest transient.
    live_buffers: list[set[int]] = [set() for _ in range(num_segments)]
    for v, _, first, last in copies:
        if graph.buffer[v] >= 0:
            for j in range(first, last + 1):
                live_buffers[j].add(graph.buffer[v])
    kept = kept_buffers(graph)
    remat_sizes = {u: remat_buffer_sizes(graph, u, kept) for u in recomputed}
    # The prediction: XLA runs each fenced branch breadth-first, so not all of
    # it is live at once (_branch). CP-SAT plans with all of it.
    branch_live: dict[int, list[tuple[int, int]]] = {}
    if not run.planning and not schedule.nested:
        branch_live = live_per_segment(graph, seg_of, remat_sizes, as_written)
    rematerialized = _rematerialized(run, remat_sizes, branch_live)
    last = layout.levels[0][1]
    own = {b for b in live_buffers[last] if layout.node_seg[b] == last} if run.net_transient else None
    transient = segment_transients(graph, seg_of, last, set(branch_live),
                                   set() if schedule.saved else recomputed | rerun, own)
    seg_end = [*(c - 1 for c in layout.starts[1:]), max(0, graph.num_positions - 1)]
    held_cotangents = _held_cotangents(graph, layout)
    in_slots = _slot_credit(run, copies, live_buffers, remat_sizes, branch_live)
    partials, partials_at_end = held_partial_bytes(graph, schedule, seg_of, num_segments)
    base = graph.input_bytes + graph.output_bytes
    peaks = [
        base + sum(graph.node_bytes[b] for b in live_buffers[j]) - in_slots[j] + rematerialized[j]
        + relayout_bytes(graph, schedule, seg_of, j, j in as_written) + transient[j]
        + boundary_cotangent_bytes(graph, seg_end[j] + 1) + held_cotangents[j] + partials[j]
        for j in range(num_segments)
    ]
    return peaks, partials_at_end


def _rematerialized(run: _Run, remat_sizes: dict[int, list[int]],
                    branch_live: dict[int, list[tuple[int, int]]]) -> list[int]:
    """Per segment, the bytes its backward rematerializes (what a fenced branch holds
    at once, where :mod:`remat_opt.memory._branch` knows it), what XLA keeps beyond
    the model for code run as written, and the forward scratch a transpose holds."""
    graph, layout = run.graph, run.layout
    seg_of, node_seg, as_written = layout.seg_of, layout.node_seg, layout.as_written
    rematerialized = [0] * layout.num_segments
    for u, sizes in remat_sizes.items():
        rematerialized[seg_of[graph.units[u].position]] += sum(sizes)
    for j, buffers in branch_live.items():
        rematerialized[j] = sum(size for _, size in buffers)
    for b in {graph.buffer[v] for v in range(graph.num_nodes) if materialized(graph, v) and not graph.is_output[v]}:
        if b >= 0 and node_seg[b] in as_written:
            rematerialized[node_seg[b]] += tail_extra_bytes(graph, b, bool(run.schedule.saved) and not run.planning, run.planning)
    last = layout.levels[0][1]
    for unit in graph.units:  # a transpose's forward scratch, held to the backward of code run as written
        if seg_of[unit.position] == last:
            rematerialized[last] += held_forward_scratch(graph, unit.index)
    return rematerialized


def _held_cotangents(graph: ProgramGraph, layout: _Layout) -> list[int]:
    """Per segment, the cotangents a doubly nested segment's callers hold.

    A nested segment whose backward runs inside another nested segment's
    backward (a conditional within a conditional) keeps the cotangents it was
    called with live until it returns, through its last segment too (XLA
    holds a conditional's operands for the whole conditional): one
    activation each on the zoo MLP's three-level trees; not so one level
    down (crediting it there over-predicted the ResNet's Revolve trees).
    Held through the last segment too, where the ResNet's Revolve tree
    peaks (docs/measurements.md, "The schedule set").
    """
    held = [0] * layout.num_segments
    for (lo, stop), (first, last) in zip(layout.ranges[1:], layout.levels[1:]):
        if any(olo <= lo and stop <= ohi for olo, ohi in layout.ranges[1:] if (olo, ohi) != (lo, stop)):
            for j in range(first, last + 1):
                held[j] += boundary_cotangent_bytes(graph, stop)
    return held


def _slot_credit(run: _Run, copies: list[Copy], live_buffers: list[set[int]], remat_sizes: dict[int, list[int]],
                 branch_live: dict[int, list[tuple[int, int]]]) -> list[int]:
    """Per segment, the stored (and, in the prediction, rematerialized) bytes that sit
    in gradient slots not yet written (:mod:`remat_opt.memory._slots`)."""
    graph, schedule, layout, planning = run.graph, run.schedule, run.layout, run.planning
    seg_of, node_seg = layout.seg_of, layout.node_seg
    slots = gradient_slots(graph)
    if schedule.saved:
        slots = () if planning else segment_slots(slots, schedule.all_cuts(), graph.num_positions)
    nested_copies = {graph.buffer[v] for v, level, _, _ in copies if level > 0}
    if planning:  # the credit CP-SAT encodes: buffers stored across cuts, in slots of their size
        crossing = {graph.buffer[v] for v, level, first, _ in copies if level == 0 and first > node_seg[v]}
        items = {b: (graph.node_bytes[b], p) for b, p in slot_candidates(graph, slots, crossing - nested_copies).items()}
        return [slot_credit([items[b] for b in live if b in items], slots) for live in live_buffers]
    # XLA's assignment: any slot as large, once for the whole step; then what is rematerialized
    stored = stored_in_slots(graph, copies, node_seg, nested_copies, schedule.saved)
    segments = tuple(seg_of[min(last, graph.num_positions - 1)] for _, last in slots)
    fenced = {j: layout.starts[j] for j in range(layout.num_segments) if j not in layout.as_written}
    return predicted_slot_credit(stored, rematerialized_buffers(graph, remat_sizes, seg_of, branch_live),
                                 live_buffers, ScheduleSlots(slots, segments, matmul_slots(graph)), fenced)
