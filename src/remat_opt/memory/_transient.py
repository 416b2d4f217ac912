"""What one unit's transpose holds in flight: its cotangent, and the scratch XLA adds.

The execution model (:mod:`remat_opt.memory._simulate`) charges each segment
its largest transient; CP-SAT's encoding and the block costs charge the same
figure (:mod:`remat_opt.solve`).
"""

from __future__ import annotations

from ..program._graph import ProgramGraph

# Quotients by a broadcast operand (a softmax's division by its row sum): see
# :func:`transient_bytes`. Not products: the same rule for a normalization's
# product by a broadcast scale over-predicted Revolve on the zoo ResNet
# (docs/measurements.md, "The schedule set").
SCALING_PRIMITIVES = frozenset({"div"})


def transient_bytes(graph: ProgramGraph, unit: int, recomputed: bool = False, fenced: bool | None = None) -> int:
    """In-flight bytes while one unit is transposed: its largest output (XLA:CPU
    writes most cotangents in place of a dead operand, so one, not two), plus
    the scratch XLA holds beside it for that equation's transpose in the
    plain program (:attr:`ProgramGraph.scratch`, read off the compile by
    :mod:`remat_opt.memory._scratch`: an NCHW convolution's cotangent in
    NHWC), plus, for a scan whose body rematerializes, what one iteration's
    rerun holds (:attr:`ProgramGraph.inner_bytes`, from
    :mod:`remat_opt.memory._inner`). In a ``fenced`` segment (by default,
    when ``recomputed``), at least the scratch of the transpose's part that
    reads forward values only, which XLA runs in the forward of code run as
    written and, behind the fence, in the backward (max pooling's index
    search: four 32-bit index buffers of the padded input, the padded input,
    and the window's outputs).

    Two for a recomputed quotient by a smaller, broadcast operand
    (``recomputed``: by a fenced segment, or by a nested segment's rerun of
    its forward; in schedules that save no names): the incoming cotangent
    stays live beside the full-size operand's cotangent, because the
    broadcast operand's cotangent is reduced from it afterwards: XLA's
    buffer assignment for a fenced attention backward (Chen's schedules on
    the GPT at sequence 512, Revolve's innermost backward on the demo GPT)
    holds the probabilities, their cotangent, the scores' cotangent and the
    product reduced for the row sum at once, four score-sized buffers. The
    plans CP-SAT finds with saved names peak elsewhere and are over-counted
    by it, so it is not charged there (docs/measurements.md, "The schedule
    set").
    """
    u = graph.units[unit]
    out = max((graph.node_bytes[v] for v in u.outputs), default=0)
    backward, forward, _ = graph.scratch[unit] if graph.scratch else (0, 0, 0)
    if graph.inner_bytes:
        out += graph.inner_bytes[unit]
    held = max(out + backward, forward if (recomputed if fenced is None else fenced) else 0)
    if recomputed and u.primitive in SCALING_PRIMITIVES and any(0 < graph.node_bytes[v] < out for v in u.inputs):
        return max(2 * out, held)
    return held


def held_forward_scratch(graph: ProgramGraph, unit: int) -> int:
    """The scratch of ``unit``'s transpose that reads forward values only and
    that its backward proper reads, held from the forward to the unit's
    backward where the code runs as written (the step's last segment): XLA
    computes it in the forward, beside the value itself, and reads it in the
    backward, as a residual of its own (max pooling's buffer of the padded
    input's shape, which its backward scatters into; not the index search's
    intermediates, which die in the forward). Counted in that segment's
    stored bytes, so also in the plain program the model is calibrated on
    (:func:`remat_opt.memory._calibrate.calibrate`), where the storage scale
    had spread it over every residual. Behind a fence it is a transient
    instead (:func:`transient_bytes`).

    Found on the development program ``pooled_resnet``, whose plan cutting
    at the pool XLA holds that buffer for; the index buffers live beside it
    are not read as scratch (XLA adds them without an ``op_name``).
    Figures: docs/measurements.md, "The haiku ResNet's regression, found;
    the pool's buffer held to the backward".
    """
    return graph.scratch[unit][2] if graph.scratch else 0
