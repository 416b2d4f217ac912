"""Gradient slots: output buffers of gradients not yet written, reused by XLA.

XLA counts every gradient's output buffer from the start of the step, but
writes it only in the backward of the segment that holds its input's last
reader; until then it lays other values, no larger, over it. The memory
model (:func:`remat_opt.memory._simulate.simulate`) credits those bytes in two ways:

* planning (the credit CP-SAT, :mod:`remat_opt.solve._encoding`, encodes): values
  stored across cuts, in slots of their own size (:func:`slot_credit`),
  none in schedules that save names;
* prediction: XLA's own assignment, approximated (:func:`assign_stored_buffers`
  for values stored across cuts and saved names, :func:`best_fit_credit` for
  what a fenced segment rematerializes), in slots as large or larger; in
  schedules that save names, free a segment later (:func:`segment_slots`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..program._graph import ProgramGraph, aval_bytes


def gradient_slots(graph: ProgramGraph) -> tuple[tuple[int, int], ...]:
    """The gradients' output buffers, as ``(bytes, position of the input's last reader)``.

    XLA counts every gradient's output allocation from the start of the step
    (``output_bytes``), but writes it only in the backward of the segment
    that holds its input's last reader; until then the allocation is free,
    and XLA lays stored values of the same size over it (on the demo GPT cut
    in segments, most stored boundaries sit in the gradient buffers of
    earlier layers' ``w_fc`` and ``w_proj``: docs/measurements.md, "Earlier
    model changes").
    Differentiated inputs that nothing reads are left out.
    """
    return tuple((size, last) for size, last, _ in _slots_with_readers(graph))


def matmul_slots(graph: ProgramGraph) -> tuple[bool, ...]:
    """Per slot of :func:`gradient_slots`, in its order: whether only matmuls
    read the input. XLA:CPU lays a convolution's kernel, transposed for its
    backward, over the kernel's own gradient buffer (most of the zoo U-Net's
    kernel gradients hold one at XLA's peak: docs/measurements.md, "The
    schedule set"), and that slot is not free for anything else."""
    return tuple(matmul for _, _, matmul in _slots_with_readers(graph))


def _slots_with_readers(graph: ProgramGraph) -> list[tuple[int, int, bool]]:
    diff = graph.traced.differentiable
    slots = []
    for k, var in enumerate(graph.traced.jaxpr.jaxpr.invars):
        if k < len(diff) and diff[k] and graph.input_readers[k]:
            last = max(graph.units[u].position for u in graph.input_readers[k])
            matmul = all(graph.units[u].primitive == "dot_general" for u in graph.input_readers[k])
            slots.append((aval_bytes(var.aval), last, matmul))
    return sorted(slots)


def slot_reads(slots: tuple[tuple[int, int], ...]) -> dict[int, list[int]]:
    """The slots' last-reader positions by slot size, in increasing order."""
    reads: dict[int, list[int]] = {}
    for size, last in sorted(slots):
        reads.setdefault(size, []).append(last)
    return reads


def slot_candidates(
    graph: ProgramGraph, slots: tuple[tuple[int, int], ...], buffers: Iterable[int] | None = None
) -> dict[int, int]:
    """Buffers (of ``buffers``, all by default) that may sit in a gradient slot
    when stored across a cut, with their positions: those for which a slot of
    their size is free before they are computed (see :func:`slot_credit`)."""
    reads = slot_reads(slots)
    out = {}
    for b in sorted((set(graph.buffer) if buffers is None else set(buffers)) - {-1}):
        position = graph.position_of(b)
        first_free = reads.get(graph.node_bytes[b])
        if first_free and first_free[0] < position:
            out[b] = position
    return out


def segment_slots(
    slots: tuple[tuple[int, int], ...], cuts: Iterable[int], num_positions: int
) -> tuple[tuple[int, int], ...]:
    """``slots`` as schedules that save names leave them, in the same order: each
    free only from the segment after its input's last reader (its position
    moved to the end of that segment).

    XLA's first-fit, which runs in program order, gives a slot to the
    same-size values of the reader's own segment (short forward
    temporaries, the names it saves) before a boundary stored there: on
    CP-SAT's named plans, crediting no slot over-predicts, crediting from
    the reader's position on under-predicts, and crediting from the next
    segment on comes closest (docs/measurements.md, "Earlier model
    changes"). The prediction only: CP-SAT plans without it
    (``simulate(planning=True)``).
    """
    ends = sorted(c - 1 for c in cuts if 0 < c < num_positions) + [num_positions - 1]
    return tuple((size, ends[bisect.bisect_left(ends, last)]) for size, last in slots)  # still sorted


def slot_credit(items: list[tuple[int, int]], slots: tuple[tuple[int, int], ...]) -> int:
    """Bytes of stored buffers that fit in free gradient slots, one buffer a slot.

    A buffer of ``(bytes, position)`` fits a slot of the same size whose
    input's last reader lies before the buffer is computed: the slot is then
    free for the buffer's whole life, since the gradient is written only in
    the backward of the reader's segment, after the backward that frees the
    buffer (a stored value crosses a cut after its position). Such slots
    form nested sets, so matching buffers in order of position, each to any
    slot left, is a largest matching (and the same one at every segment,
    whose live stored values are those read earliest).

    On Chen's schedules of the GPT most stored boundaries sit in gradient
    slots, which the model over-predicted until it credited them
    (docs/measurements.md, "Earlier model changes"). In schedules that also
    save names a slot is free later (:func:`segment_slots`).
    """
    credit = 0
    for size, reads in slot_reads(slots).items():
        matched = 0
        for position in sorted(p for z, p in items if z == size):
            if matched < bisect.bisect_left(reads, position):
                matched += 1
        credit += matched * size
    return credit


class StoredBuffer(NamedTuple):
    """A buffer stored for the backward, as :func:`assign_stored_buffers` sees it."""

    buffer: int
    size: int
    position: int  # where the forward computes it
    first_read: int  # the segment whose backward reads it last (backwards run last segment first)


def stored_in_slots(
    graph: ProgramGraph, copies: list[tuple[int, int, int, int]], node_seg: Sequence[int], nested: set[int],
    saved: frozenset[int],
) -> list[StoredBuffer]:
    """The top level's stored buffers that the prediction lays over gradient
    slots, each with the earliest segment whose backward reads it: values
    stored across a cut (not by a nested level), read first past their own
    segment, and names ``saved``, read first by their own; in schedules that
    save names, also the residuals of the last segment, which runs as written.

    Without names, not the residuals of code run as written:
    :func:`remat_opt.memory._calibrate.calibrate` fits those to XLA's peak for the plain
    program, slots included. With names, XLA lays them over gradient slots
    like any stored value: in the zoo U-Net's CP-SAT plans with stored
    values computed once (:mod:`remat_opt.memory._once`), the last
    segment's concatenations (transposed), a convolution's output and a
    ``tanh`` sit in the gradient buffers of its convolutions at its peak
    (docs/measurements.md, "The breadth-first scheduler").
    Names: in XLA's buffer assignment for the zoo U-Net's CP-SAT plans that
    save names, the names sit in the gradient buffers of its convolutions,
    which the plain program fills with transposed kernels instead. Code run
    as written then loses the slots it had in the plain program
    (:func:`remat_opt.memory._terms.tail_extra_bytes`). Plans whose XLA peak
    is in the forward, which the model does not simulate, are then
    under-predicted more (docs/measurements.md, "The schedule set", "Saved
    names in gradient slots").
    """
    first_read: dict[int, int] = {}
    for v, level, first, last in copies:
        b = graph.buffer[v]
        tail = bool(saved) and first == last == node_seg[v]  # a residual of the last segment
        if level == 0 and (first > node_seg[v] or v in saved or tail) and b >= 0 and b not in nested:
            first_read[b] = min(first_read.get(b, first), first)
    return [StoredBuffer(b, graph.node_bytes[b], graph.position_of(b), first) for b, first in first_read.items()]


def assign_stored_buffers(
    stored: Iterable[StoredBuffer], slots: tuple[tuple[int, int], ...], slot_segments: Sequence[int]
) -> dict[int, int]:
    """The gradient slot each stored buffer is laid over, as XLA's buffer assigner
    picks it: ``{slot index: buffer}``.

    XLA:CPU assigns the largest values first, and values of one size in program
    order, each to the smallest allocation it fits (not only one of its own
    size) whose other contents are never live at the same time. Stored buffers
    are all live when the forward ends, so a slot holds one at most. A slot
    ``(bytes, last)`` fits a buffer no larger, computed after ``last`` (the
    input's last reader; in schedules that save names, the end of its segment:
    :func:`segment_slots`) and dead before the gradient is written: the
    slot's segment (``slot_segments``) comes before the buffer's ``first_read``.

    The zoo U-Net's activations sit in the larger gradient buffers of its
    convolutions, which no same-size rule credits (docs/measurements.md,
    "The schedule set", "Slots as large or larger").
    """
    order = sorted(range(len(slots)), key=lambda k: slots[k])
    holder: dict[int, int] = {}
    for item in sorted(stored, key=lambda item: (-item.size, item.position)):
        for k in order:
            size, last = slots[k]
            if k not in holder and size >= item.size and last < item.position and slot_segments[k] < item.first_read:
                holder[k] = item.buffer
                break
    return holder


def best_fit_credit(buffers: Iterable[tuple[int, int]], free: Iterable[tuple[int, int]]) -> int:
    """Bytes of buffers (``(position, bytes)``, all live at once) laid over the
    ``free`` slots (``(bytes, position of the input's last reader)``), one a
    slot: largest buffer first, into the smallest slot as large read before
    the buffer's position (of those, the one read last).

    For a fenced segment's rematerialized buffers: XLA lays any temporary over
    a free gradient buffer as large, not only stored values (in the demo GPT
    cut in three segments, the middle segment's recomputed activations sit
    in the unwritten gradient buffers of the first layers' ``w_fc`` and
    ``w_proj``). A prediction only, like
    :func:`assign_stored_buffers`: CP-SAT plans without it.
    """
    room = sorted(free, key=lambda slot: (slot[0], -slot[1]))
    credit = 0
    for position, size in sorted(buffers, key=lambda buffer: (-buffer[1], buffer[0])):
        for k in range(bisect.bisect_left(room, (size, -(1 << 62))), len(room)):
            if room[k][1] < position:
                del room[k]
                credit += size
                break
    return credit


@dataclass(frozen=True)
class ScheduleSlots:
    """A schedule's gradient slots as the prediction lays values over them, each in
    the order of :func:`gradient_slots`.

    Attributes:
        slots: per slot, ``(bytes, position)``: free after that position (its input's
            last reader; in schedules that save names, the end of that reader's
            segment: :func:`segment_slots`).
        segments: per slot, the segment holding that position, whose backward writes the gradient.
        matmul: per slot, whether only matmuls read its input (:func:`matmul_slots`).
    """

    slots: tuple[tuple[int, int], ...]
    segments: tuple[int, ...]
    matmul: tuple[bool, ...]


def predicted_slot_credit(
    stored: Iterable[StoredBuffer], rematerialized: dict[int, list[tuple[int, int]]], live_buffers: list[set[int]],
    slots: ScheduleSlots, fenced: dict[int, int],
) -> list[int]:
    """Per segment, the bytes XLA lays over gradient slots at its backward (the prediction's credit).

    The ``stored`` buffers take their ``slots`` once for the whole step
    (:func:`assign_stored_buffers`), and count at the segments where they are
    live (``live_buffers``). Then each ``fenced`` segment (``{segment: its
    first position}``) lays what its backward rematerializes (``(position,
    bytes)`` in ``rematerialized``) over the slots still free, holding no
    buffer live at it (:func:`best_fit_credit`): those read before the
    segment starts, and those of a matmul's operand (``slots.matmul``)
    read before the buffer's own position. The gradient of a weight read
    inside the segment is written only when the backward reaches its
    reader, after it has freed the values computed later (so at the peak of
    Chen's three segments on the zoo GPT, XLA holds more of the middle
    segment's recomputed activations in gradient buffers than the model had
    credited). Not a convolution's kernel (:func:`matmul_slots`): crediting
    those too under-predicted the zoo U-Net's schedules. Figures:
    docs/measurements.md, "The schedule set".
    """
    stored = list(stored)
    holder = assign_stored_buffers(stored, slots.slots, slots.segments)
    size = {item.buffer: item.size for item in stored}
    credit = [sum(size[b] for b in holder.values() if b in live) for live in live_buffers]
    for j, start in fenced.items():
        free = [slot for k, slot in enumerate(slots.slots)
                if (slot[1] < start or slots.matmul[k]) and holder.get(k) not in live_buffers[j]]
        credit[j] += best_fit_credit(rematerialized.get(j, ()), free)
    return credit
