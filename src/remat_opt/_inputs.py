"""The checks of a call's inputs and outputs, before anything is planned.

``optimize`` checks its own arguments when it is called (:func:`check_argnums`
for ``argnums``; :func:`remat_opt.parse_bytes` for the budget). What can only be
checked against a call — which arguments ``argnums`` names, what they hold,
what ``fn`` returns and what it closes over — is checked by :func:`check_call`
on the first call of each signature, before the planner traces ``fn``. Each
failure is a :class:`~remat_opt.RematOptError` that names the argument, shows
what was passed and says what to do, instead of an error from deep inside JAX
(or, for an integer in a differentiated position, no error and no gradient).

Example:
    >>> import jax.numpy as jnp
    >>> check_call(lambda n, x: jnp.sum(x) * n, (3, jnp.ones(2)), {}, 0, False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    remat_opt._errors.NonDifferentiableArgumentError: args[0] is differentiated (argnums=0) ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ._errors import (
    ClosedOverTracerError,
    InvalidArgnumsError,
    InvalidLossError,
    NonDifferentiableArgumentError,
    short_repr,
)
from .program._static import combine, is_inexact_array, is_traced, mesh_sharding, split
from .program._trace import argnum_indices, normalize_argnums

__all__ = ["check_argnums", "check_call"]


def check_argnums(argnums: Any) -> None:
    """What can be checked of ``argnums`` before a call: its type, and repeats.

    Raises:
        InvalidArgnumsTypeError: not an int or a tuple/list of ints.
        InvalidArgnumsError: empty, or an index given twice.
    """
    nums = argnum_indices(argnums)
    if len(set(nums)) < len(nums):
        raise InvalidArgnumsError(f"argnums={short_repr(argnums)} names an argument more than once; pass each "
                                  "differentiated argument's index once.", argument="argnums", value=argnums)


def check_call(fn: Callable[..., Any], args: tuple, kwargs: dict, argnums: int | Sequence[int],
               has_aux: bool) -> None:
    """Checks a call of ``fn`` that is about to be planned.

    Args:
        fn: the user's function.
        args: the call's positional arguments (arrays, abstract or not, and static leaves).
        kwargs: its keyword arguments.
        argnums: as given to ``optimize``.
        has_aux: as given to ``optimize``.

    Raises:
        InvalidArgnumsError: ``argnums`` out of range for this call, or naming an argument twice.
        NonDifferentiableArgumentError: no differentiated argument holds a floating array, or
            one holds no array at all (a Python int, a string, ``None``).
        InvalidLossError: ``fn`` returns no real floating scalar (with ``has_aux``, as its first item).
        ClosedOverTracerError: ``fn`` closes over a value of an enclosing trace.
    """
    nums = normalize_argnums(argnums, len(args))
    floating = {i: any(is_inexact_array(x) for x in jax.tree_util.tree_leaves(args[i])) for i in nums}
    for i in nums:
        if not floating[i]:
            _check_integer_argument(args[i], i, argnums, any(floating.values()))
    _check_traced(fn, args, kwargs, has_aux)


def _describe(leaf: Any) -> str:
    if leaf is None:
        return "None"
    if is_traced(leaf):
        name = np.dtype(leaf.dtype).name
        return f"{'an' if name[0] in 'aeio' else 'a'} {name} array of shape {tuple(np.shape(leaf))}"
    return f"a Python {type(leaf).__name__} ({leaf!r:.60})"


def _check_integer_argument(arg: Any, i: int, argnums: Any, others_float: bool) -> None:
    """A differentiated argument without a floating array is passed through undifferentiated
    when it holds only integer or boolean arrays and another differentiated argument holds a
    floating one: ``jax.grad(..., allow_int=True)`` gives it ``float0`` zeros, and a plain
    ``jax.grad`` of the step rejects it, as it rejects it in ``fn``. (Integer leaves beside
    floating ones in one argument pass the same way.) Anything else is an error: a Python
    scalar is static to the planner and would get no gradient at all."""
    leaves = jax.tree_util.tree_leaves(arg)
    if others_float and leaves and all(is_traced(x) for x in leaves):
        return
    what = _describe(arg) if len(leaves) <= 1 and not isinstance(arg, (list, tuple, dict)) else (
        f"a {type(arg).__name__} with no floating array among its {len(leaves)} leaves")
    raise NonDifferentiableArgumentError(
        f"args[{i}] is differentiated (argnums={argnums!r}) but is {what}, which jax.grad cannot "
        f"differentiate. Pass a floating array (jnp.asarray(value, jnp.float32)) to differentiate it, "
        f"or leave index {i} out of argnums to pass it unchanged.", argument=f"args[{i}]", value=what)


def _check_traced(fn: Callable[..., Any], args: tuple, kwargs: dict, has_aux: bool) -> None:
    """Traces ``fn`` once, abstractly, to check what it returns and closes over."""
    leaves, static = split((args, kwargs))
    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=mesh_sharding(x)) for x in leaves]

    def flat_fn(*flat: Any) -> Any:
        a, k = combine(flat, static)
        return fn(*a, **k)

    closed, out = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
    tracers = [c for c in closed.consts if isinstance(c, jax.core.Tracer)]
    if tracers:
        raise ClosedOverTracerError(
            f"fn closes over {_describe(tracers[0])} traced by an enclosing transformation "
            f"({type(tracers[0]).__name__}): optimize's function was called inside jax.jit, jax.grad, "
            "jax.vmap or the like, and fn uses one of that trace's values. A plan outlives the trace, so "
            "pass the value to fn as an argument (outside argnums if it is not differentiated), or call "
            "optimize outside the transformation on a fn that does not close over its values.", argument="fn",
            value=_describe(tracers[0]))
    _check_loss(out, has_aux)


def _check_loss(out: Any, has_aux: bool) -> None:
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise InvalidLossError(f"fn must return a pair (loss, aux) with has_aux=True; got "
                                   f"{short_repr(jax.tree_util.tree_structure(out))}. Return (loss, aux), or pass "
                                   "has_aux=False.", argument="fn", value=short_repr(out))
        out = out[0]
    if not isinstance(out, jax.ShapeDtypeStruct):
        hint = " If it returns (loss, aux), pass has_aux=True." if isinstance(out, (tuple, list)) else ""
        raise InvalidLossError(f"fn must return one scalar loss; got {short_repr(jax.tree_util.tree_structure(out))}."
                               f"{hint}", argument="fn", value=short_repr(out))
    dtype = np.dtype(out.dtype)
    if out.shape != ():
        raise InvalidLossError(f"fn must return a scalar loss; got a {dtype.name} array of shape {out.shape}. "
                               "Reduce it to one number (jnp.sum, jnp.mean).", argument="fn", value=short_repr(out))
    if jax.numpy.issubdtype(dtype, jax.numpy.complexfloating):
        raise InvalidLossError(f"fn must return a real loss; got a {dtype.name} scalar, which jax.grad "
                               "differentiates only as holomorphic. Return a real number (jnp.abs, "
                               "jnp.real).", argument="fn", value=short_repr(out))
    if not jax.numpy.issubdtype(dtype, jax.numpy.floating):
        raise InvalidLossError(f"fn must return a floating-point loss; got a scalar of dtype {dtype.name}, which has "
                               "no gradient. Compute the loss in floating point (x.astype(jnp.float32)).",
                               argument="fn", value=short_repr(out))
