"""Gradient slots: output buffers of gradients not yet written, reused by XLA.

XLA counts every gradient's output buffer from the start of the step, but
writes it only in the backward of the segment that holds its input's last
reader; until then it lays other values of the same size over it. The
memory model (:func:`remat_opt._memory.simulate`) credits those bytes: for
values stored across cuts, a matching CP-SAT (:mod:`remat_opt._solve`)
encodes too; in schedules that save names, and for a fenced segment's
rematerialized buffers, refinements of the prediction only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from ._graph import ProgramGraph, aval_bytes


def gradient_slots(graph: ProgramGraph) -> tuple[tuple[int, int], ...]:
    """The gradients' output buffers, as ``(bytes, position of the input's last reader)``.

    XLA counts every gradient's output allocation from the start of the step
    (``output_bytes``), but writes it only in the backward of the segment
    that holds its input's last reader; until then the allocation is free,
    and XLA lays stored values of the same size over it (jax 0.10.2, XLA:CPU:
    on the demo GPT cut in 16 segments, 14 of its 15 stored boundaries sit in
    the gradient buffers of earlier layers' ``w_fc`` and ``w_proj``).
    Differentiated inputs that nothing reads are left out.
    """
    diff = graph.traced.differentiable
    slots = []
    for k, var in enumerate(graph.traced.jaxpr.jaxpr.invars):
        if k < len(diff) and diff[k] and graph.input_readers[k]:
            last = max(graph.units[u].position for u in graph.input_readers[k])
            slots.append((aval_bytes(var.aval), last))
    return tuple(sorted(slots))


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
    """``slots`` as schedules that save names leave them: each free only from
    the segment after its input's last reader (its position moved to the end
    of that segment).

    Measured on CP-SAT's named plans (jax 0.10.2, XLA:CPU): XLA's first-fit,
    which runs in program order, gives a slot to the same-size values of the
    reader's own segment (short forward temporaries, the names it saves)
    before a boundary stored there. Crediting no slot in such schedules
    over-predicted seven plans on the demo and seq-512 GPTs by up to 10.7%;
    crediting them from the reader's position on, under-predicted by up to
    6.2%; from the next segment on, all seven fall within 5.2%. Still
    approximate: the demo's own plans at 0.6, 0.4 and 0.3 of the plain peak
    are over-predicted by 5.4%, 7.8% and 13.2% (XLA slots more there). The
    prediction only: CP-SAT plans without it (``simulate(planning=True)``).
    """
    ends = sorted(c - 1 for c in cuts if 0 < c < num_positions) + [num_positions - 1]
    return tuple(sorted((size, ends[bisect.bisect_left(ends, last)]) for size, last in slots))


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

    Measured (jax 0.10.2, XLA:CPU): on Chen's schedules of the GPT, 14 of 15
    stored boundaries sit in gradient slots, and crediting them brings the
    demo GPT's lowest plans from +19% over-predicted to within 1.4%. In
    schedules that also save names a slot is free later (:func:`segment_slots`).
    """
    credit = 0
    for size, reads in slot_reads(slots).items():
        matched = 0
        for position in sorted(p for z, p in items if z == size):
            if matched < bisect.bisect_left(reads, position):
                matched += 1
        credit += matched * size
    return credit


def rematerialized_credit(
    sizes: Iterable[int], slots: tuple[tuple[int, int], ...], segment_start: int, stored: list[tuple[int, int]]
) -> int:
    """Bytes of a fenced segment's rematerialized buffers (``sizes``) laid over
    gradient slots: those free for the whole backward of the segment starting
    at ``segment_start`` (their input's last reader lies before it, so the
    gradient is written later) and not taken by the stored values live there
    (``stored``, as for :func:`slot_credit`).

    XLA lays any temporary over a free gradient buffer of its size, not only
    stored values: in the demo GPT cut in three segments, the middle
    segment's recomputed 256 KiB activations sit in the unwritten gradient
    buffers of the first layers' ``w_fc`` and ``w_proj`` (jax 0.10.2,
    XLA:CPU buffer assignment). Crediting them brings Chen's schedules of
    the demo GPT with 7 cuts from +11% to +5%. A prediction only, like
    :func:`segment_slots`: CP-SAT plans without it.
    """
    counts: dict[int, int] = {}
    for size in sizes:
        counts[size] = counts.get(size, 0) + 1
    credit = 0
    for size, count in counts.items():
        free = sum(1 for z, last in slots if z == size and last < segment_start)
        taken = slot_credit([item for item in stored if item[0] == size], slots) // size
        credit += min(max(0, free - taken), count) * size
    return credit
