"""Stage 1 — trace: the user's function as one flat jaxpr of primitives.

The planner works on a single list of equations in program order. Calls that
only group equations (``jit``/``pjit``, ``closed_call``, ``core_call``) and the
user's own ``jax.checkpoint`` regions are inlined, so that jitted helpers are
seen at the primitive level and the user's checkpoints are re-planned (their
numerics do not change: a checkpoint only decides what is stored).

``custom_jvp_call`` and ``custom_vjp_call`` stay as single equations: their
differentiation rules belong to the user, and partial evaluation of the JVP
(stage 2) shows their residuals at the primitive level anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src import core, source_info_util

# Primitives whose only job is to group equations; inlined on tracing.
_CALL_PARAMS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}
_CHECKPOINT_PRIMITIVES = ("checkpoint", "remat", "remat2")


@dataclass(frozen=True)
class TracedProgram:
    """The user's function as a flat jaxpr over its flattened arguments.

    Attributes:
        jaxpr: closed jaxpr with no call or checkpoint equations at top level.
        in_tree: pytree structure of ``(args, kwargs)``.
        out_tree: pytree structure of the function's output.
        differentiable: per flat input, whether it is a floating array
            reached by ``argnums`` (the inputs the planner differentiates).
    """

    jaxpr: core.ClosedJaxpr
    in_tree: Any
    out_tree: Any
    differentiable: tuple[bool, ...]


def eval_eqn(eqn: core.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
    """Binds one equation on ``invals``, keeping the user's source location."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def read_atom(env: dict, atom: Any) -> Any:
    return atom.val if isinstance(atom, core.Literal) else env[atom]


def _eval_inlined(jaxpr: core.Jaxpr, consts: Sequence[Any], *args: Any) -> list[Any]:
    env: dict = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [read_atom(env, v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in _CALL_PARAMS:
            inner = eqn.params[_CALL_PARAMS[name]]
            if isinstance(inner, core.ClosedJaxpr):
                outs = _eval_inlined(inner.jaxpr, inner.consts, *invals)
            else:
                outs = _eval_inlined(inner, (), *invals)
        elif name in _CHECKPOINT_PRIMITIVES:
            outs = _eval_inlined(eqn.params["jaxpr"], (), *invals)
        else:
            outs = eval_eqn(eqn, invals)
        env.update(zip(eqn.outvars, outs))
    return [read_atom(env, v) for v in jaxpr.outvars]


def flatten_jaxpr(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    """Inlines call and checkpoint equations, recursively, keeping source info."""
    avals = [v.aval for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *a: _eval_inlined(closed.jaxpr, closed.consts, *a))(*avals)


def normalize_argnums(argnums: int | Sequence[int], num_args: int) -> tuple[int, ...]:
    """Validates ``argnums`` against the number of positional arguments."""
    if isinstance(argnums, bool) or not isinstance(argnums, (int, np.integer, tuple, list)):
        raise TypeError(f"argnums must be an int or a tuple of ints; got {argnums!r}.")
    nums = (int(argnums),) if isinstance(argnums, (int, np.integer)) else tuple(argnums)
    if not nums:
        raise ValueError("argnums must name at least one positional argument; got ().")
    for n in nums:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"argnums must contain ints; got {argnums!r}.")
        if not -num_args <= n < num_args:
            raise ValueError(
                f"argnums={argnums!r} is out of range for a call with {num_args} positional "
                f"argument(s); use indices in [0, {num_args})."
            )
    return tuple(sorted({n % num_args for n in nums}))


def _check_leaf(path: str, leaf: Any) -> jax.ShapeDtypeStruct:
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype)
    if isinstance(leaf, (bool, int, float, complex)):
        return jax.ShapeDtypeStruct((), jax.numpy.asarray(leaf).dtype)
    raise TypeError(
        f"argument leaf {path} is a {type(leaf).__name__}, not an array; remat_opt traces "
        "every argument leaf as an array. Pass arrays (or Python scalars), or close over "
        "static values with functools.partial before calling remat_opt.optimize."
    )


def trace(
    fn: Callable[..., Any], args: tuple, kwargs: dict, argnums: tuple[int, ...]
) -> TracedProgram:
    """Traces ``fn(*args, **kwargs)`` to a flat jaxpr.

    Args:
        fn: the user's function.
        args: positional arguments (pytrees of arrays).
        kwargs: keyword arguments (pytrees of arrays), never differentiated.
        argnums: normalized positional indices that are differentiated.

    Returns:
        The traced program.

    Raises:
        TypeError: an argument leaf is not an array or scalar.
    """
    leaves_with_path, in_tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    specs = [_check_leaf(jax.tree_util.keystr(p), leaf) for p, leaf in leaves_with_path]
    diff = []
    for path, spec in zip((p for p, _ in leaves_with_path), specs):
        top = path[0].idx if hasattr(path[0], "idx") else None  # (args, kwargs)[0] -> args
        argnum = path[1].idx if top == 0 and len(path) > 1 else None
        diff.append(argnum in argnums and jax.numpy.issubdtype(spec.dtype, jax.numpy.inexact))

    out_tree_box: list = []

    def flat_fn(*flat: Any) -> list[Any]:
        a, k = jax.tree_util.tree_unflatten(in_tree, flat)
        out = fn(*a, **k)
        leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        return leaves

    closed = jax.make_jaxpr(flat_fn)(*specs)
    return TracedProgram(flatten_jaxpr(closed), in_tree, out_tree_box[0], tuple(diff))
