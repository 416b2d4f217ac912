"""Stage 1 — trace: the user's function as one flat jaxpr of primitives.

The planner works on a single list of equations in program order. Calls that
only group equations (``jit``/``pjit``, ``closed_call``, ``core_call``) and the
user's own ``jax.checkpoint`` regions are inlined, so that jitted helpers are
seen at the primitive level and the user's checkpoints are re-planned (their
numerics do not change: a checkpoint only decides what is stored).

``custom_jvp_call`` and ``custom_vjp_call`` stay as single equations: their
differentiation rules belong to the user, and partial evaluation of the JVP
(stage 2) shows their residuals at the primitive level anyway. Control flow
(``cond``, ``while``) also stays whole: each is one unit to the planner.

A ``scan`` over at most ``unroll_limit`` iterations (the scan over a model's
layers) is unrolled: its stacked inputs are split into per-iteration slices,
its body is inlined once per iteration and its stacked outputs are
concatenated, so that the planner can place checkpoints between iterations and
inside them — storing every k-th carry, or saving some of the body's values and
recomputing the rest, is then one plan over both levels under one budget. A
longer scan stays one unit to the solver (the cost of its stacked residuals
is still counted); the loop plans of :mod:`remat_opt.rewrite._loops` apply to it. :attr:`TracedProgram.unrolled_scans`
says how many were unrolled: the flat program then differs from the user's
(same values, no loop), which the pipeline measures on its own.

Tracing also follows the tangents the way JAX's JVP does (which values a
differentiated input reaches; ``stop_gradient`` and integer values stop them)
and refuses, with :class:`~remat_opt.UnsupportedProgramError` naming the
primitive and the user's source line, the programs the later stages cannot turn
into a correct checkpointed gradient: a tangent flowing into a primitive JAX has
no derivative for, or through a ``while`` loop (JAX cannot transpose one; a loop
off the differentiated path is fine), and an effect (``io_callback``, ...) that
JAX does not allow inside ``jax.checkpoint``, which the rewriter may put any
equation in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend import core, source_info_util
# The public name on every jax: jax 0.12 merged ClosedJaxpr into Jaxpr (jax._src.core has no
# ClosedJaxpr; jax.extend.core keeps it as an alias of Jaxpr, whose .jaxpr is itself and
# whose .consts are the values of its constvars), so `.jaxpr`/`.consts` work on both.
from jax.extend.core import ClosedJaxpr

from .._jax_private import primitive_jvps, remat_allowed_effects
from .._errors import InvalidArgnumsError, InvalidArgnumsTypeError, UnsupportedProgramError
from ._eval import eval_eqn, read_atom
from ._source import at_call_site
from ._static import combine, differentiated, mesh_sharding, split

# Primitives whose only job is to group equations; inlined on tracing.
_CALL_PARAMS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}
_CHECKPOINT_PRIMITIVES = ("checkpoint", "remat", "remat2")


@dataclass(frozen=True)
class TracedProgram:
    """The user's function as a flat jaxpr over its flattened arguments.

    Attributes:
        jaxpr: closed jaxpr with no call or checkpoint equations at top level.
        in_tree: pytree structure of ``(args, kwargs)`` without their static
            leaves: its leaves are the program's inputs, with their paths.
        out_tree: pytree structure of the function's output.
        differentiable: per flat input, whether it is a floating array
            reached by ``argnums`` (the inputs the planner differentiates).
        tangent_vars: the variables of ``jaxpr`` (inputs and equation outputs)
            that carry a nonzero tangent when ``differentiable`` inputs do, as
            JAX's JVP propagates them (``stop_gradient``, integer values and
            values computed from non-differentiated inputs carry none). A
            rewritten segment must differentiate only these.
        unrolled_scans: how many ``scan`` equations were unrolled into ``jaxpr``
            (nested ones included); nonzero means the flat program has no loop
            where the user's has one.
        manual: for a ``shard_map`` body, how it is traced per device
            (:class:`remat_opt.program._manual.Manual`); ``None`` for a program of its own.
    """

    jaxpr: ClosedJaxpr
    in_tree: Any
    out_tree: Any
    differentiable: tuple[bool, ...]
    tangent_vars: frozenset[core.Var]
    unrolled_scans: int = 0
    manual: Any = None


def scan_counts(params: dict) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation's parameters.

    A scan's operands (and its body's inputs) are its consts, then its carry,
    then its scanned inputs; its outputs are the carry, then the stacked outputs.
    jax 0.10 records the counts as ``num_consts``/``num_carry``; jax 0.12 records
    the operand layout instead, as a flat tree ``ft_in`` of ``(consts, carry, xs)``.
    """
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def planned_bodies(traced: TracedProgram) -> list[int]:
    """Positions of the top-level scans and ``shard_map`` calls that carry a tangent: the
    equations whose body a plan may choose the saved values of, or plan inside."""
    return [
        i for i, e in enumerate(traced.jaxpr.jaxpr.eqns)
        if e.primitive.name in ("scan", "shard_map") and any(v in traced.tangent_vars for v in e.outvars)
    ]


class _Inliner:
    """Evaluates a jaxpr with calls, checkpoints and short scans inlined."""

    def __init__(self, unroll_limit: int):
        self.unroll_limit = unroll_limit
        self.unrolled = 0

    def eval(self, jaxpr: core.Jaxpr, consts: Sequence[Any], *args: Any, caller: Any = None) -> list[Any]:
        """Evaluates ``jaxpr``, inlined; ``caller`` is the traceback of the
        equation that called it, for its equations that name no user line."""
        env: dict = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            eqn = at_call_site(eqn, caller)
            here = eqn.source_info.traceback
            invals = [read_atom(env, v) for v in eqn.invars]
            name = eqn.primitive.name
            if name in _CALL_PARAMS:
                inner = eqn.params[_CALL_PARAMS[name]]
                if isinstance(inner, ClosedJaxpr):
                    outs = self.eval(inner.jaxpr, inner.consts, *invals, caller=here)
                else:
                    outs = self.eval(inner, (), *invals, caller=here)
            elif name in _CHECKPOINT_PRIMITIVES:
                outs = self.eval(eqn.params["jaxpr"], (), *invals, caller=here)
            elif name == "scan" and 0 < eqn.params["length"] <= self.unroll_limit:
                outs = self.scan(eqn, invals)
            else:
                outs = eval_eqn(eqn, invals)
            env.update(zip(eqn.outvars, outs))
        return [read_atom(env, v) for v in jaxpr.outvars]

    def scan(self, eqn: core.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
        """One ``scan`` equation as ``length`` inlined copies of its body.

        The stacked inputs are split once (JAX transposes a ``split`` into one
        ``concatenate``, so the stacked gradient costs no per-iteration
        padding), and each per-iteration output is concatenated at the end.
        """
        p = eqn.params
        (n_consts, n_carry), length = scan_counts(p), p["length"]
        body: ClosedJaxpr = p["jaxpr"]
        consts, carry = invals[:n_consts], list(invals[n_consts : n_consts + n_carry])
        with source_info_util.user_context(eqn.source_info.traceback):
            slices = [
                [jax.lax.squeeze(s, (0,)) for s in jax.lax.split(x, (1,) * length)] if length > 1
                else [jax.lax.squeeze(x, (0,))]
                for x in invals[n_consts + n_carry :]
            ]
        ys: list[list[Any]] = [[] for _ in range(length)]
        for i in reversed(range(length)) if p["reverse"] else range(length):
            outs = self.eval(body.jaxpr, body.consts, *consts, *carry, *(s[i] for s in slices),
                             caller=eqn.source_info.traceback)
            carry, ys[i] = outs[:n_carry], outs[n_carry:]
        self.unrolled += 1
        with source_info_util.user_context(eqn.source_info.traceback):
            stacked = [
                jax.lax.concatenate([jax.lax.expand_dims(y[k], (0,)) for y in ys], 0)
                for k in range(len(eqn.outvars) - n_carry)
            ]
        return [*carry, *stacked]


def flatten_jaxpr(closed: ClosedJaxpr, unroll_limit: int = 0,
                  make_jaxpr: Callable[[Callable[..., Any], list], ClosedJaxpr] | None = None,
                  ) -> tuple[ClosedJaxpr, int]:
    """Inlines call and checkpoint equations, recursively, keeping source info.

    Args:
        closed: the traced program.
        unroll_limit: scans of at most this many iterations are unrolled too.
        make_jaxpr: ``(fn, avals) -> jaxpr``, how the program is traced
            (``jax.make_jaxpr`` by default; a ``shard_map`` body is traced per device).

    Returns:
        The flat program and how many scans were unrolled into it.
    """
    avals = [v.aval for v in closed.jaxpr.invars]
    inliner = _Inliner(unroll_limit)
    make_jaxpr = make_jaxpr or (lambda fn, avals: jax.make_jaxpr(fn)(*avals))
    flat = make_jaxpr(lambda *a: inliner.eval(closed.jaxpr, closed.consts, *a), avals)
    return flat, inliner.unrolled


def argnum_indices(argnums: Any) -> tuple[int, ...]:
    """``argnums`` as a tuple of ints, its type and emptiness checked (what can be checked
    before a call, with no count of positional arguments).

    Raises:
        InvalidArgnumsTypeError: ``argnums`` is not an int or a tuple/list of ints.
        InvalidArgnumsError: it is empty.
    """
    ints = (int, np.integer)
    nums = (argnums,) if isinstance(argnums, ints) else argnums
    if (isinstance(argnums, bool) or not isinstance(nums, (tuple, list))
            or any(isinstance(n, bool) or not isinstance(n, ints) for n in nums)):
        raise InvalidArgnumsTypeError(f"argnums must be an int or a tuple of ints; got {argnums!r} "
                                      f"({type(argnums).__name__}). Pass indices of positional arguments, "
                                      "as to jax.grad: argnums=0 or argnums=(0, 1).",
                                      argument="argnums", value=argnums)
    if not nums:
        raise InvalidArgnumsError("argnums must name at least one positional argument; got (). Pass "
                                  "argnums=0 to differentiate the first.", argument="argnums", value=argnums)
    return tuple(int(n) for n in nums)


def grad_argnums(nums: tuple[int, ...]) -> int | tuple[int, ...]:
    """Normalized ``argnums`` as ``jax.grad`` takes them: an int for one argument (so its
    gradient is not wrapped in a tuple), else the tuple."""
    return nums if len(nums) > 1 else nums[0]


def normalize_argnums(argnums: int | Sequence[int], num_args: int) -> tuple[int, ...]:
    """Validates ``argnums`` against the number of positional arguments.

    Returns:
        The indices, negative ones counted from the end, in increasing order.

    Raises:
        InvalidArgnumsTypeError: ``argnums`` is not an int or a sequence of ints.
        InvalidArgnumsError: it is empty, out of range for ``num_args`` positional
            arguments, or names an argument twice (``(0, 0)``, or ``(1, -1)`` of two).
    """
    nums = argnum_indices(argnums)
    for n in nums:
        if not -num_args <= n < num_args:
            raise InvalidArgnumsError(
                f"argnums={argnums!r} is out of range for a call with {num_args} positional "
                f"argument(s); pass indices in [0, {num_args}) (or negative ones from -{num_args}).",
                argument="argnums", value=argnums,
            )
    normalized = [int(n) % num_args for n in nums]
    if len(set(normalized)) < len(normalized):
        raise InvalidArgnumsError(
            f"argnums={argnums!r} names a positional argument more than once (indices {normalized} of a "
            f"call with {num_args}); pass each differentiated argument's index once.", argument="argnums", value=argnums
        )
    return tuple(sorted(normalized))


def trace(
    fn: Callable[..., Any], args: tuple, kwargs: dict, argnums: tuple[int, ...], unroll_limit: int = 0
) -> TracedProgram:
    """Traces ``fn(*args, **kwargs)`` to a flat jaxpr.

    Args:
        fn: the user's function.
        args: positional arguments: pytrees of arrays and static leaves (any
            other object, Python scalars included; see :mod:`remat_opt.program._static`),
            which are closed over and are not inputs of the traced program.
        kwargs: keyword arguments, the same, never differentiated.
        argnums: normalized positional indices that are differentiated.
        unroll_limit: scans of at most this many iterations are unrolled.

    Returns:
        The traced program.

    Raises:
        TypeError: an array leaf has a dtype JAX cannot trace (object, str).
        UnsupportedProgramError: the program holds an equation remat_opt cannot
            plan through (see :func:`check_plannable`).
    """
    leaves, static = split((args, kwargs))
    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=mesh_sharding(x)) for x in leaves]
    diff = differentiated(args, kwargs, argnums)

    out_tree_box: list = []

    def flat_fn(*flat: Any) -> list[Any]:
        a, k = combine(flat, static)
        out = fn(*a, **k)
        leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        return leaves

    closed, unrolled = flatten_jaxpr(jax.make_jaxpr(flat_fn)(*specs), unroll_limit)
    tangent_vars = check_plannable(closed, diff)
    return TracedProgram(closed, static.traced_treedef, out_tree_box[0], tuple(diff), tangent_vars, unrolled)


# --- What the later stages cannot plan through ---------------------------------------

# Higher-order primitives whose sub-jaxpr takes the equation's operands one to one.
_INLINE_PARAMS = {**_CALL_PARAMS, **{name: "jaxpr" for name in _CHECKPOINT_PRIMITIVES}}
# Differentiated by the user's rule, never through their body.
_CUSTOM_RULE_PRIMITIVES = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")

_WHILE_HINT = (
    "A differentiated value flows through this lax.while_loop, and JAX cannot "
    "reverse-differentiate lax.while_loop, or lax.fori_loop with dynamic start/stop "
    "values (jax.grad raises ValueError on it too). Use lax.scan, or lax.fori_loop "
    "with static (Python int) bounds: remat_opt traces every array leaf of the arguments, "
    "so bounds passed as arrays are dynamic; pass Python ints, or close over them."
)
# Primitives whose JVP rule exists only to raise.
_NO_DERIVATIVE = frozenset({"pure_callback"})


def _source(eqn: core.JaxprEqn) -> str | None:
    try:
        return source_info_util.summarize(eqn.source_info) or None
    except Exception:  # noqa: BLE001 - a location is a nicety, never worth failing over.
        return None


def has_tangent(aval: Any) -> bool:
    """Whether a value of ``aval`` carries a tangent that is not ``float0``: a floating or complex array."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.inexact)


def _as_open(jaxpr: Any) -> core.Jaxpr:
    return jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr


def _live_eqns(jaxpr: core.Jaxpr, live_out: Sequence[bool]) -> list[bool]:
    """Per equation, whether it feeds a live output or has an effect."""
    live = {v for v, keep in zip(jaxpr.outvars, live_out) if keep and isinstance(v, core.Var)}
    flags = [False] * len(jaxpr.eqns)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        if eqn.effects or any(v in live for v in eqn.outvars):
            flags[i] = True
            live.update(v for v in eqn.invars if isinstance(v, core.Var))
    return flags


def loop_tangents(
    body: core.Jaxpr, consts: list[bool], carry: list[bool], xs: list[bool]
) -> tuple[list[bool], list[bool]]:
    """Carry and extensive-output tangents of a loop body (inputs: consts, carry, xs;
    outputs: carry, ys) at their fixed point: a carry has a tangent from the first
    iteration on that gives it one."""
    carry = list(carry)
    while True:
        outs = _tangent_flow(body, [*consts, *carry, *xs], [True] * len(body.outvars))
        new = [c or o for c, o in zip(carry, outs)]
        if new == carry:
            return carry, outs[len(carry):]
        carry = new


def _tangent_flow(jaxpr: core.Jaxpr, tangent_in: Sequence[bool], live_out: Sequence[bool]) -> list[bool]:
    """Which outputs of ``jaxpr`` carry a nonzero tangent, as JAX's JVP propagates them."""
    tangent = _tangents(jaxpr, tangent_in, live_out)
    return [isinstance(v, core.Var) and tangent.get(v, False) for v in jaxpr.outvars]


def _tangents(jaxpr: core.Jaxpr, tangent_in: Sequence[bool], live_out: Sequence[bool]) -> dict:
    """Per variable of ``jaxpr``, whether it carries a nonzero tangent.

    Raises :class:`UnsupportedProgramError` at the first live equation that a
    tangent reaches and that reverse mode cannot go through.
    """
    tangent: dict = {v: t for v, t in zip(jaxpr.invars, tangent_in)}
    live = _live_eqns(jaxpr, live_out)

    def has(atom: Any) -> bool:
        return isinstance(atom, core.Var) and tangent.get(atom, False)

    for eqn, eqn_live in zip(jaxpr.eqns, live):
        t_in = [has(v) for v in eqn.invars]
        name = eqn.primitive.name
        if not any(t_in) or name == "stop_gradient":
            outs = [False] * len(eqn.outvars)
        elif name == "while":
            nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
            body = _as_open(eqn.params["body_jaxpr"])
            outs, _ = loop_tangents(body, t_in[nc : nc + nb], t_in[nc + nb :], [])
            if eqn_live and any(outs):
                raise UnsupportedProgramError(name, _source(eqn), _WHILE_HINT)
        elif name == "scan":
            n_consts, n_carry = scan_counts(eqn.params)
            carry, ys = loop_tangents(
                _as_open(eqn.params["jaxpr"]),
                t_in[:n_consts],
                t_in[n_consts : n_consts + n_carry],
                t_in[n_consts + n_carry :],
            )
            outs = [*carry, *ys]
        elif name == "cond":
            outs = [False] * len(eqn.outvars)
            for branch in eqn.params["branches"]:
                flows = _tangent_flow(_as_open(branch), t_in[1:], [True] * len(eqn.outvars))
                outs = [a or b for a, b in zip(outs, flows)]
        elif name in _INLINE_PARAMS and _INLINE_PARAMS[name] in eqn.params:
            outs = _tangent_flow(_as_open(eqn.params[_INLINE_PARAMS[name]]), t_in, [True] * len(eqn.outvars))
        elif name in _CUSTOM_RULE_PRIMITIVES or list(core.jaxprs_in_params(eqn.params)):
            outs = [True] * len(eqn.outvars)
        elif name in _NO_DERIVATIVE or eqn.primitive not in primitive_jvps:
            raise UnsupportedProgramError(
                name,
                _source(eqn),
                f"A differentiated value flows into it, and JAX has no differentiation rule for "
                f"{name!r} (jax.grad fails on it too). Wrap the call in jax.custom_jvp or "
                "jax.custom_vjp with your own rule, or pass its input through jax.lax.stop_gradient.",
            )
        else:
            outs = [True] * len(eqn.outvars)
        for v, t in zip(eqn.outvars, outs):
            tangent[v] = t and has_tangent(v.aval)
    return tangent


def _effect_in_checkpoint(jaxpr: core.Jaxpr) -> core.JaxprEqn | None:
    """The innermost equation with an effect ``jax.checkpoint`` does not allow."""
    for eqn in jaxpr.eqns:
        if not remat_allowed_effects.filter_not_in(eqn.effects):
            continue
        for sub in core.jaxprs_in_params(eqn.params):
            inner = _effect_in_checkpoint(_as_open(sub))
            if inner is not None:
                return inner
        return eqn
    return None


def check_plannable(closed: ClosedJaxpr, differentiable: Sequence[bool]) -> frozenset[core.Var]:
    """Raises if the later stages cannot turn the program into a correct checkpointed step.

    Args:
        closed: the flat program from :func:`flatten_jaxpr`.
        differentiable: per flat input, whether it is differentiated.

    Returns:
        The variables of ``closed`` that carry a nonzero tangent.

    Raises:
        UnsupportedProgramError: naming the primitive and the user's source line, when
            a differentiated value reaches a ``while`` loop or a primitive without a JVP
            rule, or an equation has an effect ``jax.checkpoint`` cannot hold.
    """
    jaxpr = closed.jaxpr
    eqn = _effect_in_checkpoint(jaxpr)
    if eqn is not None:
        names = ", ".join(sorted({type(e).__name__ for e in eqn.effects}))
        raise UnsupportedProgramError(
            eqn.primitive.name,
            _source(eqn),
            f"It has side effects ({names}) that JAX does not allow inside jax.checkpoint, and "
            "remat_opt runs every equation inside one. Move the call out of the function "
            "passed to remat_opt.optimize.",
        )
    tangent = _tangents(jaxpr, list(differentiable), [True] * len(jaxpr.outvars))
    return frozenset(v for v, t in tangent.items() if t)


def with_signature(
    fn: Callable[..., Any], traced: TracedProgram, program: Callable[..., list[Any]]
) -> Callable[..., Any]:
    """A flat program of ``traced`` as a function with ``fn``'s signature and outputs."""

    @functools.wraps(fn)
    def rewritten(*args: Any, **kwargs: Any) -> Any:
        flat, _ = split((args, kwargs))  # static leaves were closed over when tracing
        return jax.tree_util.tree_unflatten(traced.out_tree, program(*flat))

    return rewritten
