"""The naming convention shared by the graph and the rewriter.

Every primal equation ``i`` of the flat program is evaluated inside the name
scope ``remat_opt_eqn{i}`` (so every equation JAX derives from it while
differentiating, and every XLA instruction lowered from those, carries ``i`` in
its name stack), and each floating-point output ``k`` of it is tagged with
``checkpoint_name(value, "remat_opt/{i}/{k}")`` so that a name-based policy can
save it. The graph (stage 2) and the rewriter (stage 5) both evaluate the
program through :func:`eval_named`, which is what keeps the plan and the
rewritten program in agreement.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core, source_info_util
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import ClosedJaxpr

from ._eval import eval_eqn, read_atom

_SCOPE = "remat_opt_eqn"
_SCOPE_RE = re.compile(rf"{_SCOPE}(\d+)")
_VALUE_NAME_RE = re.compile(r"remat_opt/(\d+)/(\d+)")


def value_name(eqn_index: int, out_index: int) -> str:
    """The checkpoint name of output ``out_index`` of primal equation ``eqn_index``."""
    return f"remat_opt/{eqn_index}/{out_index}"


def parse_value_name(name: str) -> tuple[int, int] | None:
    """``(eqn_index, out_index)`` of a :func:`value_name`; ``None`` for any other name."""
    found = _VALUE_NAME_RE.fullmatch(name)
    return (int(found[1]), int(found[2])) if found else None


def eqn_index_of(name_stack: object) -> int | None:
    """The primal equation a (derived) equation came from, read off its name stack.

    The outermost scope is this program's: a program that is itself a rewrite
    (a loop whose body the rewriter named) carries scopes of its own inside.
    An equation JAX's partial evaluation hoists out of such a loop carries
    only the body's scope; :func:`remat_opt.program._graph.build_graph` keeps
    the position before it when that index is out of range.
    """
    found = _SCOPE_RE.findall(str(name_stack))
    return int(found[0]) if found else None


def is_nameable(aval: Any) -> bool:
    """Whether a value can be saved by name: a real floating array. Not a complex one: JAX marks
    a residual a saving policy keeps with ``reduce_precision``, which rejects complex dtypes."""
    return hasattr(aval, "dtype") and jnp.issubdtype(aval.dtype, jnp.floating)


Evaluator = Callable[[core.JaxprEqn, Sequence[Any]], list[Any]]


def eval_named(
    jaxpr: core.Jaxpr, env: dict, start: int, stop: int, evaluate: Evaluator = eval_eqn,
    wrap: Callable[[int, int, Any], Any] | None = None,
) -> None:
    """Evaluates primal equations ``start:stop`` into ``env``, scoped and named.

    ``evaluate`` binds one equation (:func:`remat_opt.program._eval.eval_eqn`); the
    graph passes one that spells out what XLA does inside an equation.
    ``wrap(i, k, value)``, if given, replaces each floating output before it
    is named (the rewriter's :func:`remat_opt.memory._once.computed_once`).
    """
    for i in range(start, stop):
        eqn = jaxpr.eqns[i]
        invals = [read_atom(env, v) for v in eqn.invars]
        with jax.named_scope(f"{_SCOPE}{i}"):
            outs = evaluate(eqn, invals)
            # Each name points at the user's line of the value it names, not at this one.
            with source_info_util.user_context(eqn.source_info.traceback,
                                               name_stack=source_info_util.current_name_stack()):
                outs = [
                    checkpoint_name(o if wrap is None else wrap(i, k, o), value_name(i, k))
                    if is_nameable(v.aval) else o
                    for k, (v, o) in enumerate(zip(eqn.outvars, outs))
                ]
        env.update(zip(eqn.outvars, outs))


def eval_program(
    closed: ClosedJaxpr, args: Sequence[Any], evaluate: Evaluator = eval_eqn
) -> list[Any]:
    """Evaluates the whole flat program with every value named."""
    env: dict = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    eval_named(closed.jaxpr, env, 0, len(closed.jaxpr.eqns), evaluate)
    return [read_atom(env, v) for v in closed.jaxpr.outvars]
