"""Running a flat program equation by equation, as JAX would bind it.

The rewriter, the namer and the planners re-evaluate a traced program under
another trace (a checkpoint, a name scope, a rewritten scan body): each
equation is bound again on its input values, with the user's source location
kept, and some positions may be run by something else instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax.extend import core, source_info_util
from jax.extend.core import ClosedJaxpr


def eval_eqn(eqn: core.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
    """Binds one equation on ``invals``, keeping the user's source location."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def read_atom(env: dict, atom: Any) -> Any:
    return atom.val if isinstance(atom, core.Literal) else env[atom]


def replaced_program(closed: ClosedJaxpr, replace: Mapping[int, Callable[[core.JaxprEqn, list], list]]
                     ) -> Callable[..., list[Any]]:
    """The program of ``closed`` as a function of its flat inputs returning its flat outputs,
    each equation at a position of ``replace`` run by ``replace[i](eqn, invals)`` instead of
    bound (a loop plan's scans, a ``shard_map`` running a rewritten body)."""
    jaxpr = closed.jaxpr

    def program(*flat_args: Any) -> list[Any]:
        env: dict = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, flat_args))
        for i, eqn in enumerate(jaxpr.eqns):
            invals = [read_atom(env, v) for v in eqn.invars]
            outs = replace[i](eqn, invals) if i in replace else eval_eqn(eqn, invals)
            env.update(zip(eqn.outvars, outs))
        return [read_atom(env, v) for v in jaxpr.outvars]

    return program
