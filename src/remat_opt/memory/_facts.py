"""The program graph as the memory model sees it: which values get buffers.

:func:`remat_opt.program.build_graph` reads the program as JAX differentiates
it: values, readers, residuals. Which of those values XLA gives a buffer of its
own, in which layout, and what a scan's rematerializing body holds per
iteration are facts about the compiler, not the program; this module attaches
them: the rules of :mod:`remat_opt.memory._fusion` (read off XLA:CPU's buffer
assignment, checked on the zoo's schedules) and :mod:`remat_opt.memory._inner`.
A primitive no rule names gets what XLA did with it in the compiled program
(:mod:`remat_opt.memory._compiled`), or a warning where there is none.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..program._cost import CostModel
from ..program._graph import ProgramGraph, aval_bytes, build_graph
from ..program._manual import named_program
from ..program._trace import TracedProgram
from ._compiled import CompiledProgram, DeferredSum, HeldBuffer, read_compiled
from ._fusion import (
    UnknownPrimitiveWarning,
    fused_and_held,
    known_primitives,
    read_in_place,
    transposed_layouts,
)
from ._inner import with_inner_bytes
from ._measure import abstract, gradient_step


def with_memory_facts(graph: ProgramGraph, compiled: CompiledProgram | None = None) -> ProgramGraph:
    """``graph`` with the memory model's facts set: fused residuals, the values
    held for them, transposed layouts, and the per-iteration bytes of scans
    whose bodies rematerialize.

    Args:
        graph: the program graph.
        compiled: XLA's account of the plain program of ``graph``
            (:func:`read_plain`). Values made by primitives the rules of
            :mod:`remat_opt.memory._fusion` do not know take XLA's decision
            from it; without it, the rules guess (see :func:`check_known`).
    """
    units = list(graph.units)
    in_place = read_in_place(units, list(graph.node_unit), list(graph.residual), list(graph.buffer),
                             list(graph.node_bytes))
    if in_place:  # jax 0.12's 1 - tanh²: its source is read as jax 0.10 read it, a residual
        graph = dataclasses.replace(graph, residual=tuple(r or v in in_place for v, r in enumerate(graph.residual)))
    fused, held = fused_and_held(graph)
    unknown = unknown_primitives(graph)
    if unknown and compiled is not None:
        fused, held = _decided_by_xla(graph, compiled, unknown, fused, held)
    transposed = transposed_layouts(units, list(graph.node_unit), list(graph.node_shape))
    summed = summed_at_end(graph, compiled.deferred) if compiled is not None else ()
    scratch = scratch_per_unit(graph, compiled.scratch) if compiled is not None else ()
    return with_inner_bytes(dataclasses.replace(graph, fused=fused, held=held, transposed=transposed,
                                                summed_at_end=summed, scratch=scratch), model_graph)


def scratch_per_unit(graph: ProgramGraph, scratch: tuple[tuple[int, int, int, int], ...],
                     ) -> tuple[tuple[int, int, int], ...]:
    """Per unit, the scratch XLA holds while it transposes the unit's equation
    (:attr:`ProgramGraph.scratch`): the first unit at an equation's position,
    the equation itself, gets it (the units after it there, such as its
    output's ``name``, would otherwise count it again where scratch adds up,
    in :func:`remat_opt.memory._branch.live_at_peak`)."""
    per_eqn = {eqn: (backward, forward, held) for eqn, backward, forward, held in scratch}
    first: dict[int, int] = {}
    for u in graph.units:
        first.setdefault(u.position, u.index)
    none = (0, 0, 0)
    return tuple(per_eqn.get(u.position, none) if first[u.position] == u.index else none for u in graph.units)


def summed_at_end(graph: ProgramGraph, deferred: tuple[DeferredSum, ...]) -> tuple[bool, ...]:
    """Per flat program input, whether XLA sums its gradient from partials held
    to the end (:attr:`ProgramGraph.summed_at_end`): a differentiated input
    read by three or more equations, one of whose transposes is an operand of
    a sum of ``deferred`` as large as the input."""
    invars = graph.traced.jaxpr.jaxpr.invars
    out = []
    for k, readers in enumerate(graph.input_readers):
        positions = {graph.units[u].position for u in readers}
        size = aval_bytes(invars[k].aval)
        out.append(bool(graph.traced.differentiable[k]) and len(readers) >= 3
                   and any(d.bytes == size and positions & d.eqns for d in deferred))
    return tuple(out)


def unknown_primitives(graph: ProgramGraph) -> tuple[str, ...]:
    """The primitives of ``graph``'s units that no rule of the model names."""
    return unknown_of(u.primitive for u in graph.units)


def unknown_of(primitives: Iterable[str]) -> tuple[str, ...]:
    """Those of ``primitives`` that no rule of the model names, sorted."""
    return tuple(sorted(set(primitives) - known_primitives()))


def check_known(graph: ProgramGraph, stacklevel: int = 3) -> None:
    """Warns (:class:`UnknownPrimitiveWarning`) when ``graph`` uses primitives no
    rule names: for a graph whose facts were not read off XLA. ``stacklevel`` is
    :func:`warnings.warn`'s, counted from here (3: the caller of this function's caller)."""
    unknown = unknown_primitives(graph)
    if unknown:
        warnings.warn(UnknownPrimitiveWarning(unknown), stacklevel=stacklevel)


def _decided_by_xla(
    graph: ProgramGraph, compiled: CompiledProgram, unknown: tuple[str, ...],
    fused: tuple[bool, ...], held: tuple[bool, ...],
) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """``fused`` and ``held`` with the values of ``unknown`` primitives (and the
    aliases laid over them) as XLA decided them in ``compiled``."""
    xla_fused, xla_held = xla_fused_and_held(graph, compiled.held)
    names = set(unknown)
    owner = [graph.buffer[v] if graph.buffer[v] >= 0 else v for v in range(graph.num_nodes)]
    decided = [graph.units[graph.node_unit[owner[v]]].primitive in names for v in range(graph.num_nodes)]
    return (tuple(x if d else r for x, r, d in zip(xla_fused, fused, decided)),
            tuple(x if d else r for x, r, d in zip(xla_held, held, decided)))


def held_nodes(graph: ProgramGraph, buffers: tuple[HeldBuffer, ...]) -> set[int]:
    """The nodes whose buffers XLA holds into the backward. A buffer no node
    stands for (a copy in another layout or precision) matches none.

    A buffer is matched to a node of its equation with its own buffer and the
    same size: the one whose primitive its ``op_name`` names (a primitive
    lowered through another's rule names that one, ``tanh`` for ``my_tanh``)
    first, then the user's value before what a JVP rule derived from it,
    then residuals.
    """
    at: dict[int, list[int]] = {}
    for v in range(graph.num_nodes):
        if graph.buffer[v] == v:
            at.setdefault(graph.position_of(v), []).append(v)
    taken: set[int] = set()
    for b in buffers:
        fits = [v for v in at.get(b.eqn, ()) if v not in taken and graph.node_bytes[v] == b.bytes]
        if not fits:
            continue
        fits.sort(key=lambda v: (not _names_alike(graph.units[graph.node_unit[v]].primitive, b.primitive),
                                 graph.node_unit[v] not in graph.primal, not graph.residual[v], v))
        taken.add(fits[0])
    return taken


def _names_alike(primitive: str, op_name_primitive: str) -> bool:
    return primitive == op_name_primitive or op_name_primitive in primitive or primitive in op_name_primitive


def xla_fused_and_held(
    graph: ProgramGraph, buffers: tuple[HeldBuffer, ...]
) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """``fused`` and ``held`` (see :class:`remat_opt.program.ProgramGraph`) as XLA
    decided them: a residual whose buffer XLA does not hold is fused into its
    backward readers; a value that is no residual but whose buffer XLA holds
    is a source that fused residuals are recomputed from."""
    held_by_xla = held_nodes(graph, buffers)
    kept = [graph.buffer[v] >= 0 and graph.buffer[v] in held_by_xla for v in range(graph.num_nodes)]
    fused = tuple(graph.residual[v] and graph.buffer[v] >= 0 and not kept[v] for v in range(graph.num_nodes))
    held = tuple(kept[v] and graph.buffer[v] == v and not graph.residual[v] for v in range(graph.num_nodes))
    return fused, held


def model_graph(traced: TracedProgram, cost_model: CostModel | None = None,
                compiled: CompiledProgram | None = None) -> ProgramGraph:
    """The program graph of ``traced`` (:func:`remat_opt.program.build_graph`)
    with the memory model's facts (:func:`with_memory_facts`)."""
    return with_memory_facts(build_graph(traced, cost_model), compiled)


def read_plain(fn: Callable[..., Any], traced: TracedProgram, args: tuple, kwargs: dict,
               argnums: int | Sequence[int], has_aux: bool = False) -> CompiledProgram:
    """XLA's account of the program of ``traced`` as written, compiled with every
    equation in its name scope (:mod:`remat_opt.program._names`) so that each
    buffer names the equation it comes from. Its peak is the plain program's.

    Args:
        fn: the user's function (its signature; the program is ``traced``'s).
        traced: the flat program (or a `shard_map` body of it, named inside its call).
        args: arguments (abstract leaves are fine), as for ``fn``.
        kwargs: keyword arguments.
        argnums: the differentiated arguments.
        has_aux: ``fn`` returns ``(loss, aux)``.
    """
    step, step_args, step_kwargs = gradient_step(named_program(fn, traced), args, kwargs, argnums, has_aux)
    return read_compiled(step, *abstract(step_args), **abstract(step_kwargs))
