"""How XLA computes half precision, where that changes which buffers exist.

A backend without a half-precision kernel for a dot or a convolution computes
it in float32: XLA's float-normalization pass converts each half-precision
operand into a float32 buffer of its own (these primitives read their
operands from memory, so the convert is not fused away), writes the result in
float32 and lets its readers' fusions convert it back, and XLA's CSE gives the
forward and the backward one copy of an operand both read. The residual the
backward keeps for such a primitive is then the float32 copy, twice the bytes
of the half-precision value. Elementwise work is upcast too, but inside
fusions, where no buffer changes.

Which (primitive, dtype) pairs a backend widens is read from the compiler,
not assumed: :func:`widened` compiles the gradient of a small probe of each
and looks at the dtype of the dot or convolution XLA emits. (XLA:CPU under
jax 0.10.2 widens all four; under jax 0.12.1 it runs bfloat16 dots natively
and still widens the rest.) The graph (:mod:`remat_opt.program._graph`) is
linearized through :func:`upcasting_evaluator`, so it holds those copies as
values of their own; the program that runs is never changed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core, source_info_util

from ._names import Evaluator
from ._eval import eval_eqn

HALF_DTYPES = ("bfloat16", "float16")


def _dot_probe(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(x @ w).astype(jnp.float32))


def _conv_probe(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(lax.conv_general_dilated(x, w, (1, 1), "SAME")).astype(jnp.float32))


# Each primitive XLA may widen: the probe's function, the shapes of (w, x), and
# the HLO opcode it compiles to.
_PROBES = {
    "dot_general": (_dot_probe, ((64, 64), (64, 64)), "dot"),
    "conv_general_dilated": (_conv_probe, ((8, 8, 3, 3), (2, 8, 16, 16)), "convolution"),
}
UPCAST_PRIMITIVES = frozenset(_PROBES)


@functools.cache
def widened(backend: str | None = None) -> frozenset[tuple[str, str]]:
    """The (primitive, dtype) pairs XLA on ``backend`` (the default backend if
    ``None``) computes in float32: a pair is in it when the compiled gradient of
    its probe holds that primitive's HLO op with a float32 result. Compiled once
    per backend in a process (a few tiny compiles)."""
    device = jax.devices(backend)[0]
    pairs = set()
    for primitive, (probe, shapes, opcode) in _PROBES.items():
        for dtype in HALF_DTYPES:
            args = [jax.device_put(np.zeros(s, dtype), device) for s in shapes]
            hlo = jax.jit(jax.grad(probe, argnums=(0, 1))).lower(*args).compile().as_text() or ""
            if re.search(rf"= f32\[[\d,]*\]\{{[^}}]*\}} {opcode}\(", hlo):
                pairs.add((primitive, dtype))
    return frozenset(pairs)


def reads_half_precision(jaxpr: core.Jaxpr) -> bool:
    """Whether an equation of ``jaxpr`` (or of a jaxpr it calls) that XLA may widen reads a
    half-precision operand: only then is :func:`widened` (a few compiles) worth asking."""
    return any(eqn.primitive.name in UPCAST_PRIMITIVES
               and any(str(getattr(v.aval, "dtype", "")) in HALF_DTYPES for v in eqn.invars)
               for eqn in jaxpr.eqns) or any(reads_half_precision(j) for j in core.subjaxprs(jaxpr))


def upcasting_evaluator(pairs: frozenset[tuple[str, str]]) -> Evaluator:
    """Binds each equation as XLA runs it: a primitive with an operand of a dtype it
    is paired with in ``pairs`` becomes convert to float32, the primitive in float32,
    convert back."""

    def evaluate(eqn: core.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
        name = eqn.primitive.name
        narrow = [(name, str(getattr(v.aval, "dtype", ""))) in pairs for v in eqn.invars]
        if not any(narrow):
            return eval_eqn(eqn, invals)
        wide_eqn = eqn.replace(params=dict(eqn.params, preferred_element_type=np.dtype(np.float32)))
        with source_info_util.user_context(eqn.source_info.traceback):
            wide = [lax.convert_element_type(x, np.float32) if n else x
                    for x, n in zip(invals, narrow)]
        outs = eval_eqn(wide_eqn, wide)
        with source_info_util.user_context(eqn.source_info.traceback):
            return [lax.convert_element_type(o, cast(jax.core.ShapedArray, v.aval).dtype)
                    for o, v in zip(outs, eqn.outvars)]

    return evaluate
