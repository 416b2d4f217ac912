"""A scan's body as a program of its own: one iteration, planned once for all.

A ``lax.scan`` kept as a loop runs the same body ``length`` times, and JAX
stacks whatever the body's backward needs, one slice per iteration. What the
body saves is therefore decided once, for every iteration, by a policy on the
body. To let the solver make that choice, the body is turned into a
:class:`~remat_opt.program._trace.TracedProgram` over one iteration's inputs
(consts, carry, one slice of the scanned inputs), differentiated where the
scan differentiates them, and its graph is built like any program's
(:func:`remat_opt.program._graph.build_graph`): the same names, the same
residuals as JAX's JVP rules give them. Planning cost then depends on the
body's size, not on the number of iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
from jax.extend import core
from jax.extend.core import ClosedJaxpr

from ._graph import aval_bytes
from ._trace import TracedProgram, check_plannable, flatten_jaxpr, loop_tangents, scan_counts


@dataclass(frozen=True)
class ScanBody:
    """A top-level scan's body, flattened, as a program over one iteration.

    Attributes:
        position: the scan's equation index in the flat program.
        length: its iteration count.
        program: the body over ``(consts, carry, x)``, calls inlined; its
            equation indices are the ones :func:`remat_opt.program._names.value_name`
            names, both in the body's graph and in the rewritten loop.
        carry_bytes: bytes of one iteration's carry (a decoder's residual stream).
    """

    position: int
    length: int
    program: TracedProgram
    carry_bytes: int = 0


def flat_body(body: ClosedJaxpr) -> ClosedJaxpr:
    """The scan body with its calls and checkpoints inlined (scans inside kept whole)."""
    return flatten_jaxpr(body)[0]


def scan_body(traced: TracedProgram, position: int) -> ScanBody:
    """The body of the scan at ``position`` of ``traced``, as a program of one iteration.

    A body input is differentiated when the scan gives it a tangent: a const or
    scanned input whose operand carries one, a carry at the loop's fixed point.
    """
    eqn = traced.jaxpr.jaxpr.eqns[position]
    if eqn.primitive.name != "scan":
        raise ValueError(f"position {position} is a {eqn.primitive.name!r} equation, not a scan.")
    n_consts, n_carry = scan_counts(eqn.params)
    body = flat_body(eqn.params["jaxpr"])
    has = [isinstance(v, core.Var) and v in traced.tangent_vars for v in eqn.invars]
    carry, _ = loop_tangents(body.jaxpr, has[:n_consts], has[n_consts:n_consts + n_carry],
                             has[n_consts + n_carry:])
    diff = tuple(bool(d) for d in [*has[:n_consts], *carry, *has[n_consts + n_carry:]])
    n_in, n_out = len(body.jaxpr.invars), len(body.jaxpr.outvars)
    program = TracedProgram(
        jaxpr=body,
        in_tree=jax.tree_util.tree_structure(((tuple(range(n_in)),), {})),
        out_tree=jax.tree_util.tree_structure(list(range(n_out))),
        differentiable=diff,
        tangent_vars=check_plannable(body, diff),
    )
    carry_bytes = sum(aval_bytes(v.aval) for v in body.jaxpr.invars[n_consts:n_consts + n_carry])
    return ScanBody(position, eqn.params["length"], program, carry_bytes)
