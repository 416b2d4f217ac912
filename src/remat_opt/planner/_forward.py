"""Forward mode: whether JAX is forward-differentiating the current call.

A plan's checkpointed segments are ``jax.custom_vjp`` functions, and JAX cannot
push a tangent forward through one ("can't apply forward-mode autodiff (jvp)
to a custom_vjp function"). So an :class:`remat_opt.OptimizedFunction` called
under ``jax.jvp``, ``jax.jacfwd``, ``jax.hessian`` or a forward-over-reverse
product runs the user's function as written, without the plan: same values,
the memory of the function as written.

Reverse mode is not forward mode here: ``jax.grad``, ``jax.vjp`` and
``jax.linearize`` trace with JAX's linearize trace, not its JVP trace (jax
0.10), and keep the plan.
"""

from __future__ import annotations

from typing import Any

import jax

from .._jax_private import DynamicJaxprTrace as _STAGING
from .._jax_private import JVPTrace, JVPTracer, current_trace

# The attributes through which one tracer wraps the value of the trace below it:
# a linearize or JVP tracer its primal, a batch tracer its batched value.
_INNER = ("primal", "val")


def _has_jvp_tracer(value: Any) -> bool:
    while isinstance(value, jax.core.Tracer):
        if isinstance(value, JVPTracer):
            return True
        value = next((getattr(value, a) for a in _INNER if hasattr(value, a)), None)
    return False


def _under_jvp_trace() -> bool:
    """Whether a JVP trace encloses the current trace, below any staging trace.

    The walk stops at a staging trace (``jax.jit``, ``lax.scan``, ...): a jitted
    function traced once under ``jax.jvp`` would keep that trace in jit's cache
    and later run without its plan under ``jax.grad``. So ``jax.jvp(jax.jit(step))``
    is left to raise JAX's error; ``jax.jit(jax.jvp(step, ...))`` works.
    """
    trace = current_trace()
    while trace is not None and not isinstance(trace, _STAGING):
        if isinstance(trace, JVPTrace):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def forward_mode(args: tuple, kwargs: dict) -> bool:
    """Whether a call on ``args`` and ``kwargs`` is being forward-differentiated.

    True when an argument leaf is a JVP tracer (at any depth of nested
    transformations: forward-over-reverse hands the function linearize tracers
    whose primals are JVP tracers) or when a JVP trace encloses the current one
    (a function closing over what is forward-differentiated).
    """
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    return _under_jvp_trace() or any(_has_jvp_tracer(leaf) for leaf in leaves)
