"""Loops that rematerialize inside: what one iteration's backward holds.

A ``lax.scan`` kept as a loop is one unit of the graph: its stacked residuals
are what JAX's partial evaluation stores for it, and the model counts them
like any other residual. When the scan's body is under ``jax.checkpoint``
(a loop plan of :mod:`remat_opt.rewrite._loops`, or the user's own ``nn.remat`` in
``nn.scan``), that is not all: the backward loop reruns the body's forward
for each iteration and holds what that recomputation stores while the
iteration's backward runs. For iterations nested in checkpointed groups, one
group's rerun holds the inner scan's stacked residuals, and the inner scan's
iterations rematerialize again.

The model charges that as the scan unit's transient (see
:func:`remat_opt.memory._transient.transient_bytes`): the peak of the body's own
gradient, simulated by the same model on the body's own graph, above the
body's inputs and outputs (live in the enclosing program already), less the
bytes per iteration the enclosing scan stores for it: without it the loop
plans that nest iterations in groups were predicted far under XLA's peak
(docs/measurements.md, "Loop-plan fidelity").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.extend.core import ClosedJaxpr

from .._errors import UnsupportedProgramError
from .._schedule import Schedule
from ..program._graph import ProgramGraph
from ..program._trace import _CHECKPOINT_PRIMITIVES, TracedProgram, has_tangent, scan_counts, trace
from ._simulate import simulate

ModelGraph = Callable[[TracedProgram], ProgramGraph]
"""How the memory model builds a program's graph with its facts
(:func:`remat_opt.memory._facts.model_graph`, which calls :func:`with_inner_bytes`: a body's
own loops recurse). Passed in, so that this module does not import ``_facts``."""


def rematerializes(jaxpr: core.Jaxpr) -> bool:
    """Whether ``jaxpr`` holds a checkpoint, at any depth."""
    return any(eqn.primitive.name in _CHECKPOINT_PRIMITIVES for eqn in jaxpr.eqns) or any(
        rematerializes(j) for j in core.subjaxprs(jaxpr)
    )


def iteration_backward_bytes(eqn: core.JaxprEqn, tangent_in: list[bool], model_graph: ModelGraph) -> int:
    """Peak bytes of one iteration's gradient of the scan ``eqn``'s body above
    the body's own inputs and outputs, as the memory model simulates it (a
    body whose loops rematerialize in turn is charged for them the same way).

    Args:
        eqn: a ``scan`` equation.
        tangent_in: per operand of ``eqn``, whether it carries a tangent.
        model_graph: how the model builds the body's gradient's graph.
    """
    body: ClosedJaxpr = eqn.params["jaxpr"]
    avals = [v.aval for v in body.jaxpr.invars]
    n_consts, n_carry = scan_counts(eqn.params)
    # A carry whose initial value has no tangent gets one from the body when
    # any differentiated value flows into it; a float carry is assumed to.
    diff = [t or (n_consts <= k < n_consts + n_carry and has_tangent(a))
            for k, (t, a) in enumerate(zip(tangent_in, avals))]
    floats = [k for k, v in enumerate(body.jaxpr.outvars) if has_tangent(v.aval)]

    def loss(dargs: list, fixed: list, cotangents: list) -> Any:
        it_d, it_f = iter(dargs), iter(fixed)
        outs = jax.core.eval_jaxpr(body.jaxpr, body.consts, *[next(it_d) if d else next(it_f) for d in diff])
        return sum((jnp.sum(outs[k] * c) for k, c in zip(floats, cotangents)), jnp.zeros((), jnp.float32))

    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
    args = (
        [spec(a) for a, d in zip(avals, diff) if d],
        [spec(a) for a, d in zip(avals, diff) if not d],
        [spec(body.jaxpr.outvars[k].aval) for k in floats],
    )
    graph = model_graph(trace(loss, args, {}, (0,)))
    peak = simulate(graph, Schedule(plain=True)).peak_bytes
    return max(0, peak - graph.input_bytes - graph.output_bytes)


def with_inner_bytes(graph: ProgramGraph, model_graph: ModelGraph) -> ProgramGraph:
    """``graph`` with :attr:`ProgramGraph.inner_bytes` set: per scan unit whose
    body rematerializes, what one iteration's backward holds beyond the bytes
    the scan stores per iteration (its stacked residuals over its length).
    A body the model cannot trace on its own is not charged; ``model_graph`` builds a body's
    graph (see :data:`ModelGraph`)."""
    eqns = graph.traced.jaxpr.jaxpr.eqns
    inner = [0] * len(graph.units)
    for u in graph.units:
        eqn = eqns[u.position]
        if u.primitive != "scan" or eqn.primitive.name != "scan" or not rematerializes(eqn.params["jaxpr"].jaxpr):
            continue
        tangent_in = [isinstance(v, core.Var) and v in graph.traced.tangent_vars for v in eqn.invars]
        stored = sum(graph.node_bytes[v] for v in u.outputs if graph.residual[v]) // max(1, eqn.params["length"])
        try:
            held = iteration_backward_bytes(eqn, tangent_in, model_graph)
        except UnsupportedProgramError:
            continue  # a body the model cannot trace on its own: its rerun is not charged (as before)
        inner[u.index] = max(0, held - stored)
    return dataclasses.replace(graph, inner_bytes=tuple(inner)) if any(inner) else graph
