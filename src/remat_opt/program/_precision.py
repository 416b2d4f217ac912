"""How XLA computes half precision, where that changes which buffers exist.

XLA:CPU has no float16/bfloat16 kernel for a dot or a convolution: its
float-normalization pass (``float-normalization-bf16`` in the compiled
module's pass dump, jax 0.10.2) computes them in float32. Each half-precision
operand is converted into a float32 buffer of its own (these primitives read
their operands from memory, so the convert is not fused away), the result is
written in float32 and converted back by its readers' fusions, and XLA's CSE
gives the forward and the backward one copy of an operand both read. So the
residual the backward keeps for such a dot is the float32 copy (twice the
bytes of the bfloat16 value), on top of the half-precision value itself when
another reader needs it (``1 - tanh²``). Elementwise work is upcast too, but
inside fusions, where no buffer changes. jax 0.12's XLA:CPU runs the forward's
bfloat16 dots natively (XNNPACK fusions) but still computes the backward's in
float32 on float32 copies of the activations: the buffers the backward keeps,
and the plain peak of tests/test_mixed_precision.py's MLP, are the same bytes.

The graph (:mod:`remat_opt.program._graph`) is linearized through
:func:`upcasting_evaluator`, so it holds those copies as values of their own;
the program that runs is never changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import jax
import numpy as np
from jax import lax
from jax.extend import core, source_info_util

from ._names import Evaluator
from ._eval import eval_eqn

# Primitives XLA:CPU computes in float32 when their operands are half precision.
UPCAST_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})


def upcast_dtypes(backend: str | None = None) -> frozenset[str]:
    """Dtypes whose :data:`UPCAST_PRIMITIVES` XLA computes in float32 on ``backend``
    (the default backend if ``None``): half precision on CPU, none elsewhere."""
    if (backend or jax.default_backend()) != "cpu":
        return frozenset()
    return frozenset({"float16", "bfloat16"})


def upcasting_evaluator(dtypes: frozenset[str]) -> Evaluator:
    """Binds each equation as XLA runs it: an upcast primitive with operands of
    ``dtypes`` becomes convert to float32, the primitive in float32, convert back."""

    def evaluate(eqn: core.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
        narrow = [str(getattr(v.aval, "dtype", "")) in dtypes for v in eqn.invars]
        if eqn.primitive.name not in UPCAST_PRIMITIVES or not any(narrow):
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
