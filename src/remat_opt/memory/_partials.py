"""Gradient partials XLA holds until one sum at the end of the step.

A weight read by several equations (a recurrent cell's weights, unrolled in
Python over the sequence; a tied embedding) gets one partial cotangent per
reader. JAX adds them up as they come (a chain of ``add_any``), but XLA may
not: XLA:CPU fuses the whole chain into one n-ary sum, which runs once every
partial exists, so each partial buffer is held from the backward that writes
it to the end of the step. Whether it does is read off the program's own
compile (:func:`remat_opt.memory._compiled.deferred_sums`, set as
:attr:`remat_opt.program.ProgramGraph.summed_at_end`), not assumed.

Found on the development set's LSTM (``experiments/dev_programs.py``): its
plain step holds every step's partial of the recurrent weight, and Chen's
sqrt(n) segmentation one per fenced segment that reads it, most of its peak
and none of it counted by the model before (docs/measurements.md, "Gradient
partials summed at the end: diagnosed on a development set, then measured
on held-out programs").

What a schedule holds: a fenced segment's backward returns one partial for
the segments it reads the weight in (JAX's transpose of the checkpointed
segment sums its own readers'); code run as written (the last segment of a
level) leaves one partial per reader. While segment ``J``'s backward runs,
the partials of the segments after it are held, and, in code run as written,
its own; one of them is the gradient's own buffer, which the model counts
among the outputs already.
"""

from __future__ import annotations

from .._schedule import Schedule
from ..program._graph import ProgramGraph, aval_bytes


def held_partial_bytes(
    graph: ProgramGraph, schedule: Schedule, seg_of: tuple[int, ...], num_segments: int
) -> tuple[list[int], int]:
    """Bytes of gradient partials held beyond the gradients' own buffers.

    Each level of ``schedule`` runs its segments' backwards last first. A
    fenced segment, or a nested one (whose inner partials are summed inside
    its own backward), returns one partial of a weight it reads; the last
    segment of a level runs as written and leaves one per reader. While an
    innermost segment's backward runs, the partials of the segments after it,
    at its own level and at every level around it, are held, and its own
    readers' partials by its end.

    Args:
        graph: the program graph, with :attr:`ProgramGraph.summed_at_end` set.
        schedule: the schedule (``plain``: one segment run as written).
        seg_of: the innermost segment of each position.
        num_segments: the number of innermost segments.

    Returns:
        Per innermost segment, the bytes held while its backward runs; and the
        bytes held at the end of the step, once every partial exists.
    """
    per_segment = [0] * num_segments
    at_end = 0
    if not graph.summed_at_end or not seg_of:
        return per_segment, at_end
    invars = graph.traced.jaxpr.jaxpr.invars
    for k, summed in enumerate(graph.summed_at_end):
        if not summed:
            continue
        size = aval_bytes(invars[k].aval)
        at = [0] * (graph.num_positions + 1)
        for u in graph.input_readers[k]:
            at[graph.units[u].position] += 1
        before = [0]
        for n in at:
            before.append(before[-1] + n)

        def visit(level: Schedule, lo: int, hi: int, around: int, before: list[int] = before, size: int = size) -> int:
            """Visits the segments of ``level`` in ``[lo, hi)``, last first, with
            ``around`` partials held by the levels around it; returns the
            partials its backward leaves."""
            bounds = [lo, *sorted(c for c in level.cuts if lo < c < hi), hi]
            nested = dict(level.nested)
            done = 0
            for i in range(len(bounds) - 2, -1, -1):
                a, b = bounds[i], bounds[i + 1]
                readers = before[b] - before[a]
                if a in nested:
                    visit(nested[a], a, b, around + done)
                    done += min(1, readers)
                    continue
                j = seg_of[min(a, graph.num_positions - 1)]
                per_segment[j] += size * max(0, around + done + readers - 1)
                done += readers if b == hi else min(1, readers)
            return done

        at_end += size * max(0, visit(Schedule() if schedule.plain else schedule, 0, graph.num_positions, 0) - 1)
    return per_segment, at_end
