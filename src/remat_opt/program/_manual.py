"""A ``shard_map``'s body as a program of its own, traced per device.

A ``shard_map`` runs its body once per device, on each device's shard, and
the body's collectives (``psum``, ``all_gather``, ``axis_index``) name the
mesh axes it is manual over. Memory is per device, so what the body saves is
a per-device choice: it is planned as a scan body is
(:mod:`remat_opt.program._scan_body`, one iteration), its graph built on the
per-device shapes, and the body rewritten under a ``save_only_these_names``
policy inside the same ``shard_map``.

Outside a ``shard_map`` the body cannot be traced: its axis names are unbound,
and JAX types every per-device value with the axes it varies over
(``check_vma``), which a bare trace drops. So every trace of the body (its
flattening, its linearization in :func:`remat_opt.program._graph.build_graph`)
runs inside ``jax.shard_map`` over the same mesh and specs, on the global
shapes, and reads back the per-device jaxpr JAX built for it: JAX's own
partitioner decides the per-device types, nothing here does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax import lax
from jax.extend import core
from jax.extend.core import ClosedJaxpr

from .._jax_private import as_manual_mesh, check_vma, extend_axis_env
from ._names import eval_program
from ._eval import replaced_program
from ._trace import TracedProgram, check_plannable, flatten_jaxpr, planned_bodies, with_signature

try:  # jax >= 0.7
    from jax import shard_map
except ImportError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map  # type: ignore[no-redef]  # older jax's path to it


@dataclass(frozen=True)
class Manual:
    """How a ``shard_map`` body is traced: inside ``shard_map`` with the call's own parameters.

    Attributes:
        mesh: the call's mesh.
        in_specs, out_specs: a ``PartitionSpec`` per body input and per body output.
        axis_names: the mesh axes the body is manual over.
        check_vma: the call's ``check_vma``.
        global_avals: per body input, the shape and type of the call's operand (all devices').
        outer: the flat program the call is an equation of.
        position: the call's equation index in ``outer``.
    """

    mesh: Any
    in_specs: tuple
    out_specs: tuple
    axis_names: frozenset
    check_vma: bool
    global_avals: tuple
    outer: TracedProgram = dataclasses.field(repr=False, compare=False)
    position: int

    def wrap(self, fn: Callable[..., Any], inputs: Sequence[int], outputs: Sequence[int]) -> Callable[..., Any]:
        """``fn`` (of the body inputs ``inputs``, returning a tuple of the body outputs
        ``outputs``, in those orders) as a ``shard_map`` of the call's mesh."""
        return shard_map(fn, mesh=self.mesh, in_specs=tuple(self.in_specs[i] for i in inputs),
                         out_specs=tuple(self.out_specs[o] for o in outputs),
                         axis_names=self.axis_names, check_vma=self.check_vma)

    def context(self) -> Any:
        """The context JAX traces the body in (its own ``shard_map`` tracing enters the same):
        the axis names bound, the mesh's manual axes, and ``check_vma``. JAX's transformations
        of the per-device jaxpr (partial evaluation re-binds ``psum`` and ``axis_index``) run in it."""
        stack = contextlib.ExitStack()
        stack.enter_context(extend_axis_env(self.mesh, self.axis_names))
        stack.enter_context(jax.sharding.use_abstract_mesh(as_manual_mesh(self.mesh, self.axis_names)))
        stack.enter_context(check_vma(self.check_vma))
        return stack

    def make_jaxpr(self, fn: Callable[..., Any], inputs: Sequence[int], outputs: Sequence[int]) -> ClosedJaxpr:
        """The per-device jaxpr of ``fn`` (as :meth:`wrap` takes it), as JAX traces it inside the call."""
        outer = jax.make_jaxpr(self.wrap(fn, inputs, outputs))(*(self.global_avals[i] for i in inputs))
        calls = [e for e in outer.jaxpr.eqns if e.primitive.name == "shard_map"]
        inner = calls[0].params["jaxpr"] if len(calls) == 1 else None
        if inner is None or len(inner.invars) != len(inputs) or inner.constvars:
            raise ValueError("the shard_map body did not trace to one per-device jaxpr over its inputs")
        return ClosedJaxpr(inner, ())

    def outer_program(self, body: Callable[..., Sequence[Any]]) -> Callable[..., list[Any]]:
        """The flat program of :attr:`outer` with the call running ``body`` (a function of the
        body's flat inputs returning its flat outputs) on each device in place of its own."""
        call = self.wrap(lambda *a: tuple(body(*a)), range(len(self.in_specs)), range(len(self.out_specs)))
        return replaced_program(self.outer.jaxpr, {self.position: lambda eqn, invals: list(call(*invals))})


def manual_of(traced: TracedProgram, position: int) -> Manual:
    """The :class:`Manual` of the ``shard_map`` equation at ``position`` of ``traced``."""
    eqn = traced.jaxpr.jaxpr.eqns[position]
    p = eqn.params
    return Manual(p["mesh"], tuple(p["in_specs"]), tuple(p["out_specs"]), frozenset(p["newly_manual_axes"]),
                  bool(p["check_vma"]), tuple(v.aval for v in eqn.invars), traced, position)


def make_program_jaxpr(traced: TracedProgram, fn: Callable[..., Any], inputs: Sequence[int],
                       outputs: Sequence[int]) -> ClosedJaxpr:
    """``fn`` of ``traced``'s inputs ``inputs`` (flat, in that order), returning a tuple of
    values shaped as its outputs ``outputs``, traced: per device for a ``shard_map`` body."""
    if traced.manual is None:
        avals = [v.aval for v in traced.jaxpr.jaxpr.invars]
        return jax.make_jaxpr(fn)(*(avals[i] for i in inputs))
    return traced.manual.make_jaxpr(fn, inputs, outputs)


def planned_body(traced: TracedProgram) -> TracedProgram | None:
    """The per-device body planned in place of ``traced``, when ``traced``'s work is one
    ``shard_map`` call: the only top-level ``shard_map`` or ``scan`` that carries a tangent
    (a model written per device, its loss outside). ``None`` otherwise: calls of one layer
    each are planned between them, as units (their bodies would share one budget)."""
    bodies = planned_bodies(traced)
    if len(bodies) != 1 or traced.jaxpr.jaxpr.eqns[bodies[0]].primitive.name != "shard_map":
        return None
    return shard_map_body(traced, bodies[0])


def named_program(fn: Callable[..., Any], traced: TracedProgram) -> Callable[..., Any]:
    """``fn``'s program as ``traced`` runs it, every equation in its name scope
    (:func:`remat_opt.program._names.eval_program`), with ``fn``'s signature: the program
    read for XLA's facts. A ``shard_map`` body is named inside its call, on each device."""
    def named(*flat: Any) -> list[Any]:
        return eval_program(traced.jaxpr, flat)

    if traced.manual is None:
        return with_signature(fn, traced, named)
    return with_signature(fn, traced.manual.outer, traced.manual.outer_program(named))


def program_context(traced: TracedProgram) -> Any:
    """The context JAX's transformations of ``traced``'s jaxpr run in (its axis names bound)."""
    return contextlib.nullcontext() if traced.manual is None else traced.manual.context()


def shard_map_body(traced: TracedProgram, position: int) -> TracedProgram:
    """The body of the ``shard_map`` at ``position`` of ``traced``, flattened, as a per-device program.

    A body input is differentiated where the call's operand carries a tangent.
    """
    eqn = traced.jaxpr.jaxpr.eqns[position]
    if eqn.primitive.name != "shard_map":
        raise ValueError(f"position {position} is a {eqn.primitive.name!r} equation, not a shard_map.")
    manual = manual_of(traced, position)
    body = ClosedJaxpr(eqn.params["jaxpr"], ())
    n_in, n_out = len(body.jaxpr.invars), len(body.jaxpr.outvars)
    everything, outs = range(n_in), range(n_out)
    # Each output leaves through a copy (which XLA elides): the body's own last segment runs as
    # written, so without one its last layer could never be recomputed. Its outputs' cotangents
    # come from outside the call, so a fence there holds, unlike a program's last segment.
    flat = flatten_jaxpr(body, make_jaxpr=lambda f, avals: manual.make_jaxpr(
        lambda *a: tuple(lax.copy_p.bind(o) for o in f(*a)), everything, outs))[0]
    diff = tuple(isinstance(v, core.Var) and v in traced.tangent_vars for v in eqn.invars)
    return TracedProgram(
        jaxpr=flat,
        in_tree=jax.tree_util.tree_structure(((tuple(range(n_in)),), {})),
        out_tree=jax.tree_util.tree_structure(list(range(n_out))),
        differentiable=diff,
        tangent_vars=check_plannable(flat, diff),
        manual=manual,
    )
