"""Stage 6 — measure: what XLA says the program costs.

One definition of "peak" is used everywhere — in the budget, the plan, the
tests and the benchmarks: the bytes XLA allocates for
``jax.jit(jax.value_and_grad(fn, argnums))`` on these arguments, that is
argument + output + temp − alias from ``compiled.memory_analysis()``.
(``peak_memory_in_bytes`` on CPU reports arguments and outputs only; docs/xla_findings.md §1.)
FLOPs are counted on the jaxpr, because XLA's ``cost_analysis`` counts after
CSE and hides or shows recomputation depending on its passes (docs/xla_findings.md §4).

Arguments with static leaves (an Equinox module's activation functions; see
:mod:`remat_opt.program._static`) are measured the way ``eqx.filter_value_and_grad``
runs them: the floating array leaves of the ``argnums`` arguments are
differentiated, the other arrays are inputs that are not, and the static
leaves are closed over.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from .._jax_private import dce_jaxpr, trace_context
from ..program._cost import CostModel, jaxpr_flops
from ..program._static import (
    Static,
    combine,
    differentiated,
    is_traced,
    mesh_sharding,
    owners,
    split,
)
from ..program._trace import normalize_argnums
from ._compiles import peak_as_jit_compiles


def abstract(tree: Any) -> Any:
    """``tree`` with every traced leaf replaced by its ``jax.ShapeDtypeStruct``
    (static leaves are kept as they are).

    A leaf placed on a mesh keeps its sharding (:func:`mesh_sharding`), so a
    program compiled on the abstract arguments is partitioned as it is on the
    real ones and XLA's ``memory_analysis()`` describes one device's share.
    """
    def spec(x: Any) -> Any:
        shape, dtype = jax.numpy.shape(x), jax.numpy.result_type(x)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=mesh_sharding(x))

    return jax.tree_util.tree_map(lambda x: spec(x) if is_traced(x) else x, tree)


@dataclass(frozen=True)
class Signature:
    """A call's arguments as the planner sees them.

    Attributes:
        static: the tree structure and its static leaves (compared by equality, or identity).
        avals: per array leaf, its shape, dtype and sharding over a mesh (or ``None``).
    """

    static: Static
    avals: tuple[tuple[tuple[int, ...], str, Any], ...]


def signature(args: tuple, kwargs: dict) -> Signature:
    """The signature of a call on ``args`` and ``kwargs`` (arrays, abstract values or static leaves)."""
    leaves, static = split((args, kwargs))
    return Signature(static, tuple((tuple(jax.numpy.shape(x)), str(jax.numpy.result_type(x)), mesh_sharding(x))
                                   for x in leaves))


@dataclass(frozen=True, eq=False)
class StepCall:
    """A call whose gradient step XLA compiles: ``jax.value_and_grad(fn, argnums,
    has_aux=has_aux)`` on ``args`` and ``kwargs`` (:func:`gradient_step`).

    Attributes:
        fn: the function, returning a scalar (``(loss, aux)`` with ``has_aux``).
        args: positional arguments (arrays, abstract values or static leaves).
        kwargs: keyword arguments, never differentiated.
        argnums: the differentiated positional arguments, as ``jax.grad`` takes them.
        has_aux: ``fn`` returns ``(loss, aux)``.
    """

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    argnums: int | Sequence[int]
    has_aux: bool = False


def gradient_step(
    fn: Callable[..., Any], args: tuple, kwargs: dict, argnums: int | Sequence[int], has_aux: bool
) -> tuple[Callable[..., Any], tuple, dict]:
    """``jax.value_and_grad(fn, argnums)`` and the arguments to call it on.

    When every leaf is an array and every leaf of the ``argnums`` arguments
    floating, that is ``jax.value_and_grad(fn, argnums)`` on ``args`` and
    ``kwargs``. Otherwise it is a function of two lists of arrays, the
    differentiated ones (the floating array leaves of the ``argnums``
    arguments, as ``eqx.filter_value_and_grad`` picks them, and as
    ``jax.grad(..., allow_int=True)`` differentiates) and the others, with the
    static leaves closed over.
    """
    leaves, static = split((args, kwargs))
    nums = normalize_argnums(argnums, len(args))
    diff = differentiated(args, kwargs, nums)
    if not static.any and all(f for f, owner in zip(diff, owners(args, kwargs)) if owner in nums):
        return jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux), args, kwargs

    def step(diff_leaves: list, other_leaves: list) -> Any:
        d, o = iter(diff_leaves), iter(other_leaves)
        a, k = combine([next(d) if f else next(o) for f in diff], static)
        return fn(*a, **k)

    picked = ([x for x, f in zip(leaves, diff) if f], [x for x, f in zip(leaves, diff) if not f])
    return jax.value_and_grad(step, has_aux=has_aux), picked, {}


def per_function(store: weakref.WeakKeyDictionary, fn: Callable[..., Any]) -> dict:
    """``store``'s dict for ``fn``, kept while ``fn`` lives; a fresh one on every call for a
    function that cannot be weakly referenced (then nothing is kept)."""
    try:
        return store.setdefault(fn, {})
    except TypeError:
        return {}


_traces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per function, its gradient steps traced, by ``argnums``, ``has_aux`` and argument signature."""


def traced_step(fn: Callable[..., Any], args: tuple, kwargs: dict, argnums: int | Sequence[int],
                has_aux: bool) -> jax.stages.Traced:
    """``jax.jit`` of :func:`gradient_step` traced on the arguments' abstract values.

    Kept while ``fn`` lives (as ``jax.jit`` keeps its traces): the planner
    counts a candidate's FLOPs on this jaxpr and compiles its lowering, and
    tracing a rewritten program costs about as much as either. Arguments
    with the same shapes, dtypes, shardings and static leaves share a trace,
    under the same JAX configuration (``jax.jit``'s own trace context: x64,
    default matmul precision...).
    """
    context = trace_context()
    key = (context, repr(argnums), has_aux, signature(args, kwargs))
    per_fn = per_function(_traces, fn)
    if key not in per_fn:
        step, step_args, step_kwargs = gradient_step(fn, args, kwargs, argnums, has_aux)
        per_fn[key] = jax.jit(step).trace(*abstract(step_args), **abstract(step_kwargs))
    return per_fn[key]


def peak_bytes(
    fn: Callable[..., Any], *args: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False, **kwargs: Any
) -> int:
    """XLA's peak for one gradient step of ``fn``, as :func:`remat_opt.peak_bytes` reads it,
    on arguments already checked."""
    lowered = traced_step(fn, args, kwargs, argnums, has_aux).lower()
    return peak_as_jit_compiles(lowered, lambda low: memory_of(low.compile()))  # once per distinct program


def memory_of(compiled: Any) -> int:
    """argument + output + temp − alias bytes of a compiled computation."""
    m = compiled.memory_analysis()
    return int(
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    )


def gradient_flops(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict,
    argnums: int | Sequence[int],
    cost_model: CostModel | None = None,
    has_aux: bool = False,
) -> int:
    """FLOPs of the jaxpr of ``jax.value_and_grad(fn)``: forward, recomputation and backward.

    Dead equations are dropped first (``pe.dce_jaxpr``, as XLA would): the
    jaxpr of a gradient keeps, for instance, the mask a ``reduce_max`` JVP
    computes for a tangent that a ``stop_gradient`` then discards, and whether
    it does depends on how the program is nested in ``jit`` calls.
    """
    closed = traced_step(fn, tuple(args), kwargs, argnums, has_aux).jaxpr
    live, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return jaxpr_flops(live, cost_model)
