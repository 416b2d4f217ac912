"""Gradient partials XLA holds until one sum at the end of the step.

A weight read by several equations (a recurrent cell's weights, unrolled in
Python over the sequence; a tied embedding) gets one partial cotangent per
reader. JAX adds them up as they come (a chain of ``add_any``), but XLA may
not: XLA:CPU fuses the whole chain into one n-ary sum, which runs once every
partial exists, so each partial buffer is held from the backward that writes
it to the end of the step. Whether it does is read off the program's own
compile (:func:`remat_opt.memory._compiled.deferred_sums`, set as
:attr:`remat_opt.program.ProgramGraph.summed_at_end`), not assumed.

Measured (jax 0.10.2, XLA:CPU) on the development set's LSTM
(``experiments/dev_programs.py``: 12 steps, a 224x896 recurrent weight):
its plain step holds twelve 784 KiB partials of that weight, and Chen's
sqrt(n) segmentation one per fenced segment that reads it (the sum's twelve
operands are the conditionals' outputs): 8.4 MiB of its 12.9 MiB peak, none
of which the model counted (it predicted 4.9 MiB).

What a schedule holds: a fenced segment's backward returns one partial for
the segments it reads the weight in (JAX's transpose of the checkpointed
segment sums its own readers'); code run as written (the last segment of a
level) leaves one partial per reader. While segment ``J``'s backward runs,
the partials of the segments after it are held, and, in code run as written,
its own; one of them is the gradient's own buffer, which the model counts
among the outputs already.
"""

from __future__ import annotations

from ..program._graph import ProgramGraph, aval_bytes


def held_partial_bytes(
    graph: ProgramGraph, seg_of: tuple[int, ...], as_written: set[int], num_segments: int
) -> tuple[list[int], int]:
    """Bytes of gradient partials held beyond the gradients' own buffers.

    Args:
        graph: the program graph, with :attr:`ProgramGraph.summed_at_end` set.
        seg_of: the segment of each position.
        as_written: the segments that run as written (the last of each level).
        num_segments: the number of segments.

    Returns:
        Per segment, the bytes held while its backward runs; and the bytes
        held at the end of the step, once every partial exists.
    """
    per_segment = [0] * num_segments
    at_end = 0
    if not graph.summed_at_end:
        return per_segment, at_end
    invars = graph.traced.jaxpr.jaxpr.invars
    for k, summed in enumerate(graph.summed_at_end):
        if not summed:
            continue
        size = aval_bytes(invars[k].aval)
        readers = [0] * num_segments
        for u in graph.input_readers[k]:
            readers[seg_of[graph.units[u].position]] += 1
        done = 0  # partials of the segments after J: their backwards ran first
        for j in range(num_segments - 1, -1, -1):
            per_segment[j] += size * max(0, done + readers[j] - 1)
            done += readers[j] if j in as_written else min(1, readers[j])
        at_end += size * max(0, done - 1)
    return per_segment, at_end
