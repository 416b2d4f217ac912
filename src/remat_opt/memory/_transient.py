"""What one unit's transpose holds in flight: its cotangent, and the scratch XLA adds.

The execution model (:mod:`remat_opt.memory._simulate`) charges each segment
its largest transient; CP-SAT's encoding and the block costs charge the same
figure (:mod:`remat_opt.solve`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..program._graph import ProgramGraph, per_graph

# Quotients by a broadcast operand (a softmax's division by its row sum): see
# :func:`transient_bytes`. Not products: the same rule for a normalization's
# product by a broadcast scale over-predicted Revolve on the zoo ResNet
# (docs/measurements.md, "The schedule set").
SCALING_PRIMITIVES = frozenset({"div"})

# Equations whose transpose is a program of its own (a loop, a branch, a custom
# rule): it reads the equation's residuals until it ends, so none of them is free
# while its cotangent is in flight (see :func:`as_written_transient`).
PROGRAM_PRIMITIVES = frozenset({"scan", "while", "cond", "custom_jvp_call", "custom_vjp_call",
                                "custom_vjp_call_jaxpr", "checkpoint", "remat", "pjit", "closed_call"})


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


def segment_transients(graph: ProgramGraph, seg_of: Sequence[int], last: int, breadth_first: set[int],
                       recomputed: set[int], net_stored: set[int] | None = None) -> list[int]:
    """Per segment, the largest transient of its backward (:func:`transient_bytes`).

    Args:
        graph: the program graph.
        seg_of: per position, its segment.
        last: the step's last segment (run as written, not behind a fence).
        breadth_first: segments whose forward scratch the breadth-first count already
            holds (not charged as behind a fence either).
        recomputed: units recomputed in their segment's backward (empty where names are saved).
        net_stored: in the prediction, the buffers the last segment stores: its transient is
            then net of those freed by then (:func:`as_written_transient`).
    """
    transient = [0] * (max(seg_of, default=0) + 1)
    in_last: dict[int, int] = {}
    for u in graph.units:
        j = seg_of[u.position]
        # Behind a fence: every segment but the step's last (a nested level's last runs in a
        # fenced backward), unless the breadth-first count already holds its forward scratch.
        held = transient_bytes(graph, u.index, u.index in recomputed, j != last and j not in breadth_first)
        transient[j] = max(transient[j], held)
        if j == last:
            in_last[u.index] = held
    if net_stored is not None:
        transient[last] = as_written_transient(graph, list(in_last), net_stored, in_last)
    return transient


_DOWNSTREAM: dict[int, dict[int, int]] = {}


def downstream_positions(graph: ProgramGraph) -> dict[int, int]:
    """Per position, the positions that read what it computes, directly or through
    others, as a bit set (bit ``q`` for position ``q``); once per graph."""
    def made() -> dict[int, int]:
        by_position: dict[int, list[int]] = {}
        for unit in graph.units:
            by_position.setdefault(unit.position, []).append(unit.index)
        down: dict[int, int] = {}
        for p in sorted(by_position, reverse=True):
            bits = 0
            for u in by_position[p]:
                for c in (c for v in graph.units[u].outputs for c in graph.consumers[v]):
                    q = graph.units[c].position
                    if q != p:
                        bits |= (1 << q) | down.get(q, 0)
            down[p] = bits
        return down
    return per_graph(_DOWNSTREAM, graph, made)


def as_written_transient(graph: ProgramGraph, units: list[int], stored: set[int], transients: dict[int, int]) -> int:
    """The largest transient of the step's last segment (code run as written), net of
    the segment's own stored buffers its backward has surely freed by then.

    A unit's cotangent exists only once the transposes of everything downstream
    of it have run, and those read the residuals computed downstream of it for
    the last time; the residuals of its own position (a sine's cosine, a
    square's doubled input) are read for the last time by its own transpose,
    which XLA:CPU writes in place of one, unless that transpose is a program
    (:data:`PROGRAM_PRIMITIVES`: a scan reads its stacked residuals in every
    iteration of its backward). So a transient counts only beyond the stored
    bytes of the positions downstream of it and, but for a program, of its own.
    Only the cotangent takes a freed buffer: what the transpose holds beside it
    (its scratch, a scan's rerun of one iteration) counts whole.
    Residuals of parallel branches are not freed: XLA's breadth-first
    scheduler may run the branch's transposes in any order.

    Args:
        graph: the program graph.
        units: the units of the segment (positions from its first to the program's last, so
            that what is downstream of them is in it).
        stored: buffers the segment stores for its own backward (computed in it).
        transients: per unit of ``units``, :func:`transient_bytes`.
    """
    down = downstream_positions(graph)
    stored_at: dict[int, int] = {}
    for b in stored:
        stored_at[graph.position_of(b)] = stored_at.get(graph.position_of(b), 0) + graph.node_bytes[b]
    stored_mask = sum(1 << p for p in stored_at)
    worst = 0
    for u in sorted(units, key=lambda u: -transients[u]):
        if transients[u] <= worst:
            break
        unit = graph.units[u]
        cotangent = min(transients[u], max((graph.node_bytes[v] for v in unit.outputs), default=0))
        beside = transients[u] - cotangent
        own = 0 if unit.primitive in PROGRAM_PRIMITIVES else 1 << unit.position
        freed, mask = 0, (down[unit.position] | own) & stored_mask
        while mask and freed < cotangent:  # nearest positions first; stop once it cannot count
            low = mask & -mask
            freed += stored_at[low.bit_length() - 1]
            mask ^= low
        worst = max(worst, beside + max(0, cotangent - freed))
    return worst
