"""Which values XLA:CPU gives a buffer of its own: facts the graph records about fusion.

XLA fuses cheap elementwise work into its readers, so many residuals JAX lists
never get a buffer (they are recomputed inside the backward's fusions), while
some values JAX does not list are held for those fusions. Each rule here was
read off XLA's buffer assignment (jax 0.10.2, XLA:CPU); :mod:`remat_opt.program._graph`
applies them when it builds the program graph (the measurements behind
them: docs/measurements.md, "Fidelity: predicted against measured peak").
"""

from __future__ import annotations

from ..program._cost import ELEMENTWISE_PRIMITIVES, FREE_PRIMITIVES, REDUCTION_PRIMITIVES, known_calls
from ..program._graph import ALIASING_PRIMITIVES, ProgramGraph, Unit

# Elementwise (or broadcast-like) primitives XLA:CPU fuses into their consumers
# and duplicates freely (not in XLA's ``IsExpensive``): a value made by one of
# these from values the backward holds anyway never gets a buffer of its own.
CHEAP_FUSIBLE_PRIMITIVES = frozenset({
    "add", "add_any", "sub", "mul", "neg", "max", "min", "select_n", "integer_pow", "square",
    "abs", "sign", "convert_element_type", "broadcast_in_dim", "iota", "eq", "ne", "lt", "le",
    "gt", "ge", "and", "or", "not", "xor", "clamp", "floor", "ceil", "round", "copy", "copy_p",
    "reshape", "squeeze", "expand_dims", "name", "stop_gradient", "transpose", "reduce_precision",
    "real", "imag", "conj", "is_finite", "nextafter",
    # jax 0.12's 1 - x² (tanh's JVP uses it): lowered, on every backend, to (1 + x) * (1 - x),
    # an add, a sub and a mul, which is all XLA sees of it.
    "one_minus_square",
})

# Cheap functions of a primitive's output that a JVP rule makes the residual where
# earlier jax made the output itself one: jax 0.12's tanh JVP reads only
# one_minus_square(tanh(x)); jax 0.10's read tanh(x) and 1 - tanh(x). XLA compiles
# both to the same buffers (every zoo model's plain gradient measures the same bytes
# on each): it recomputes 1 - tanh² inside the backward's fusions from tanh(x),
# which it holds. See read_in_place.
HELD_IN_PLACE_PRIMITIVES = frozenset({"one_minus_square"})

# Consumers that read their operands from memory (XLA:CPU never fuses a
# producer into them): an operand of one of these is materialized in the forward.
MATERIALIZING_CONSUMERS = frozenset({
    "dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter_add",
    "dynamic_slice", "dynamic_update_slice", "sort", "cumsum", "cumprod", "cummax", "cumlogsumexp",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "while", "cond", "scan",
    "fft", "triangular_solve", "cholesky", "lu", "qr", "eigh", "svd",
})


# Reductions: XLA:CPU reads their operand from memory.
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "reduce_and",
                        "reduce_or"})


class UnknownPrimitiveWarning(UserWarning):
    """The program uses primitives no rule of the memory model names, and XLA's
    account of it was not read: the model guesses which of their values get a
    buffer (as if they were expensive), so plans may recompute more than
    needed. ``optimize`` reads XLA's account by default."""

    def __init__(self, primitives: tuple[str, ...]):
        super().__init__(
            f"remat_opt's memory model has no rule for the primitive(s) {', '.join(primitives)}; "
            "it treats their values as materialized. Plans stay verified on XLA, but may recompute "
            "more than needed. Let optimize read XLA's compiled program (xla_facts=True, the default)."
        )
        self.primitives = primitives


def known_primitives() -> frozenset[str]:
    """Every primitive some rule of the model (or of the cost model) names."""
    return (CHEAP_FUSIBLE_PRIMITIVES | MATERIALIZING_CONSUMERS | REDUCTIONS | ALIASING_PRIMITIVES
            | ELEMENTWISE_PRIMITIVES | FREE_PRIMITIVES | REDUCTION_PRIMITIVES | known_calls())


def read_by_backward(graph: ProgramGraph, node: int) -> bool:
    """Whether the backward reads the value: a residual, or a held source."""
    return graph.residual[node] or bool(graph.held and graph.held[node])


def materialized(graph: ProgramGraph, node: int) -> bool:
    """Whether the backward holds a buffer for the value: a residual XLA does not
    fuse away, or the source a fused residual is recomputed from
    (:attr:`ProgramGraph.held`)."""
    if graph.held and graph.held[node]:
        return True
    return graph.residual[node] and not (graph.fused and graph.fused[node])


def transposed_layouts(
    units: list[Unit], node_unit: list[int], shapes: list[tuple[int, ...]]
) -> tuple[bool, ...]:
    """Per node: XLA lays the value out transposed (it turns ``transpose`` into a
    layout change, and elementwise work on such a value keeps that layout)."""
    out = [False] * len(node_unit)
    for unit in units:
        for v in unit.outputs:
            out[v] = unit.primitive == "transpose" or (
                unit.primitive not in MATERIALIZING_CONSUMERS
                and any(out[w] and shapes[w] == shapes[v] for w in unit.inputs)
            )
    return tuple(out)


def read_in_place(
    units: list[Unit], node_unit: list[int], residual: list[bool], buffer: list[int], node_bytes: list[int]
) -> list[int]:
    """The values the backward reads in place of a residual of :data:`HELD_IN_PLACE_PRIMITIVES`.

    Such a residual, made from one value of its own size that a unit XLA does
    not duplicate computed (``tanh``), is recomputed from that value in the
    backward's fusions, which hold the value instead: what jax 0.10 listed as
    a residual itself. Marking these as residuals gives the graph jax 0.10
    gave (the residual is then a cheap one of a kept value, and fuses), so the
    rules here, measured on jax 0.10, apply unchanged. Not extended to other
    cheap residuals of one value: on jax 0.10 that changes predictions that
    were measured as they are (a product of a quotient by a constant).
    """
    out = []
    for v, is_residual in enumerate(residual):
        unit = units[node_unit[v]]
        if not is_residual or unit.primitive not in HELD_IN_PLACE_PRIMITIVES or len(unit.inputs) != 1:
            continue
        (w,) = unit.inputs
        source = buffer[w]
        if (source >= 0 and node_bytes[w] == node_bytes[v]
                and units[node_unit[source]].primitive not in CHEAP_FUSIBLE_PRIMITIVES):
            out.append(w)
    return out


def fused_residuals(graph: ProgramGraph, held: tuple[bool, ...] | None = None) -> tuple[bool, ...]:
    """Per node of ``graph``: a residual XLA recomputes inside the backward's fusions instead of keeping.

    A residual made by a cheap elementwise unit (``1 - tanh²``, ``2 (x - m)``,
    a broadcast of a constant) from values the backward holds anyway (program
    inputs, other kept residuals, values ``held`` for other fused residuals,
    or such cheap values of them) is fused into its backward readers by XLA
    and has no buffer, unless a forward reader that works from memory (a
    ``dot_general``) forces it into one.
    """
    units, node_unit, residual, buffer = graph.units, graph.node_unit, graph.residual, graph.buffer
    consumers, reduced = graph.consumers, graph.reduced
    n = len(node_unit)
    readers: list[set[str]] = [set() for _ in range(n)]  # readers of each buffer, through aliases
    res_buf = [False] * n  # the backward reads the buffer (through any alias)
    for v in range(n):
        b = buffer[v]
        if b >= 0:
            readers[b].update(units[u].primitive for u in consumers[v])
            res_buf[b] = res_buf[b] or residual[v]
    kept = [False] * n  # a buffer the backward holds anyway (a residual XLA keeps)
    free = [False] * n  # available to the backward at no cost of its own
    fused = [False] * n
    for unit in units:
        for v in unit.outputs:
            b = buffer[v]
            if b < 0:  # alias of a program input
                free[v] = True
                continue
            if b != v:
                kept[v], free[v], fused[v] = kept[b], free[b], fused[b]
                continue
            cheap = unit.primitive in CHEAP_FUSIBLE_PRIMITIVES and not (readers[v] & MATERIALIZING_CONSUMERS)
            inputs_free = all(free[w] or kept[w] or (held is not None and held[buffer[w]]) for w in unit.inputs)
            if res_buf[v]:
                fused[v] = cheap and inputs_free and not (reduced and reduced[v])  # see program._linearize.reduced_residuals
                kept[v] = not fused[v]
                free[v] = True
            else:
                free[v] = unit.primitive in CHEAP_FUSIBLE_PRIMITIVES and inputs_free
    return tuple(fused)


def fused_sources(graph: ProgramGraph, fused: tuple[bool, ...],
                  computed_once: frozenset[int] = frozenset()) -> tuple[bool, ...]:
    """Per node of ``graph``: a value XLA keeps for the backward because a fused residual
    (of ``fused``, per node) is recomputed from it.

    XLA duplicates cheap elementwise work into every fusion that reads it, so a
    fused residual (``fused_residuals``) is recomputed in its backward fusions
    from the nearest values that are not cheap: walking up through cheap units
    (even ones whose own buffer is kept), to a convolution, a dot, a reduction,
    a transcendental. Those sources stay live into the backward. On XLA:CPU
    (jax 0.10.2), in a group norm, the relu mask and ``(x - mean) *
    rsqrt(var)`` are recomputed in the backward from the convolution's output,
    which XLA holds, although JAX's residuals are ``x - mean`` and the relu
    output. The walk also stops at a cheap value a reduction reads directly
    (a residual stream under a layer norm's mean): XLA materializes a
    reduction's operand, and the fusions read it there. Program inputs are
    live anyway and are not marked.

    The walk also stops at a node of ``computed_once``: a value a conditional
    XLA cannot fuse reads (:mod:`remat_opt.memory._once`), which XLA computes once
    and the fusions then read, the node itself and not another computation
    of the same buffer. Found on the zoo U-Net, whose group norms compute
    ``x - mean`` twice (for the variance, then to normalize; one buffer
    after CSE): in a plan naming the first ``x - mean`` of each block XLA
    holds no convolution output behind it in the last segment, in one
    naming only the second it does (docs/measurements.md, "The schedule
    set").
    """
    units, node_unit, residual, buffer = graph.units, graph.node_unit, graph.residual, graph.buffer
    n = len(node_unit)
    reduced_in_forward = [False] * n  # a reduction reads the buffer (through any alias)
    for unit in units:
        if unit.primitive in REDUCTIONS:
            for w in unit.inputs:
                if buffer[w] >= 0:
                    reduced_in_forward[buffer[w]] = True
    held = [False] * n
    seen: set[int] = set()
    stack = [v for v in range(n) if residual[v] and fused and fused[v]]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        for w in units[node_unit[v]].inputs:
            b = buffer[w]
            if b < 0 or w in computed_once:
                continue  # a program input (or an alias of one), or a value computed once
            producer = units[node_unit[b]]
            if producer.primitive in CHEAP_FUSIBLE_PRIMITIVES and not reduced_in_forward[b]:
                stack.append(b)  # duplicated into the reading fusion: go on up
            else:
                held[b] = True
    return tuple(held)


def fused_and_held(graph: ProgramGraph) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """:func:`fused_residuals` and :func:`fused_sources` of ``graph``, to their common fixpoint.

    A value held for one fused residual makes cheap residuals computed from
    it fusable too: XLA keeps the MLP's ``dot_general`` output for the
    GELU's fused ``tanh`` and ``x³`` terms, and then recomputes the bias add
    ``h + b`` (JAX's residual) inside the backward's fusions from it as well,
    instead of holding both (XLA's buffer assignment for the demo GPT cut
    in three segments: the middle segment's backward holds, per layer, the
    matmul output but no bias-add buffer; docs/measurements.md, "Earlier
    model changes"). Both sets only grow, so the iteration ends (bounded anyway).
    """
    fused = fused_residuals(graph)
    held = fused_sources(graph, fused)
    for _ in range(len(graph.units)):
        again = fused_residuals(graph, held)
        if again == fused:
            break
        fused = again
        held = fused_sources(graph, fused)
    return fused, held
