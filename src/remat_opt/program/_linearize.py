"""The program's forward and backward, split as ``jax.linearize`` splits them.

:func:`linearized` partially evaluates the program's JVP: the known program
is the forward (its outputs are the primal outputs, then the residuals the
backward reads), the linear program the backward. :func:`reduced_residuals`
reads, off the backward, which residuals it reduces against a cotangent.
:func:`remat_opt.program._graph.build_graph` builds its graph on both.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.extend import core
from jax.extend.core import ClosedJaxpr

from .._jax_private import partial_eval_jaxpr_nounits
from ._manual import make_program_jaxpr, program_context
from ._names import eval_program
from ._precision import reads_half_precision, upcasting_evaluator, widened
from ._trace import TracedProgram


def linearized(traced: TracedProgram) -> tuple[ClosedJaxpr, ClosedJaxpr, int]:
    """The program's JVP split by partial evaluation, as ``jax.linearize`` does: the
    known (forward) program, whose outputs are the primal outputs and then the
    residuals, the linear (backward) program, and the number of residuals.

    Inputs are ordered as the JVP takes them: differentiated inputs, their
    tangents, then the inputs not differentiated.
    """
    closed = traced.jaxpr
    diff = traced.differentiable
    nd = sum(diff)
    nf = len(diff) - nd
    evaluate = upcasting_evaluator(widened() if reads_half_precision(closed.jaxpr) else frozenset())

    def primal(dargs: list, fixed: list) -> list:
        it_d, it_f = iter(dargs), iter(fixed)
        full = [next(it_d) if d else next(it_f) for d in diff]
        return eval_program(closed, full, evaluate)

    def jvp(*flat: Any) -> tuple:
        dargs, tangents, fixed = flat[:nd], flat[nd:2 * nd], list(flat[2 * nd:])
        primals_out, tangents_out = jax.jvp(lambda *p: primal(list(p), fixed), dargs, tangents)
        return (*primals_out, *tangents_out)

    diff_inputs = [k for k, d in enumerate(diff) if d]
    outputs = range(len(closed.jaxpr.outvars))
    jvp_jaxpr = make_program_jaxpr(traced, jvp, [*diff_inputs, *diff_inputs, *(k for k, d in enumerate(diff) if not d)],
                                   [*outputs, *outputs])
    unknowns = [False] * nd + [True] * nd + [False] * nf
    with program_context(traced):
        known, linear, _, res_avals = partial_eval_jaxpr_nounits(jvp_jaxpr, unknowns, False)
    return known, linear, len(res_avals)


def reduced_residuals(linear: core.Jaxpr, num_residuals: int) -> set[int]:
    """Indices of the residuals the backward reduces against a cotangent.

    In the linear (tangent) program a residual multiplied by a smaller tangent,
    broadcast before the ``mul`` or inside it (``normalized * d_scale[None]``
    in a norm layer), transposes to ``reduce_sum(normalized * ct)``: the
    gradient of the scale. XLA:CPU runs that reduction as a fusion that reads
    its elementwise operands from memory, so the residual gets a buffer even
    when it is cheap to recompute (the zoo ResNet's group norms' normalized
    activations are held through their segment's backward).
    The residuals are the leading inputs of the linear program.
    """
    def size(v: Any) -> int:
        return int(np.prod(getattr(v.aval, "shape", ()), dtype=np.int64))

    index = {v: k for k, v in enumerate(linear.invars[:num_residuals])}
    smaller: dict[Any, int] = {}  # tangent -> elements it was broadcast from
    out: set[int] = set()
    for eqn in linear.eqns:
        if eqn.primitive.name == "broadcast_in_dim" and isinstance(eqn.invars[0], core.Var):
            src = eqn.invars[0]
            smaller[eqn.outvars[0]] = min(size(src), smaller.get(src, size(src)))
        elif eqn.primitive.name == "mul" and len(eqn.invars) == 2:
            a, b = eqn.invars
            for res, other in ((a, b), (b, a)):
                if not (isinstance(res, core.Var) and res in index and isinstance(other, core.Var)):
                    continue
                if other not in index and smaller.get(other, size(other)) < size(res):
                    out.add(index[res])
    return out
