"""The program graph as the memory model sees it: which values get buffers.

:func:`remat_opt.program.build_graph` reads the program as JAX differentiates
it: values, readers, residuals. Which of those values XLA gives a buffer of its
own, in which layout, and what a scan's rematerializing body holds per
iteration are facts about the compiler, not the program; this module attaches
them (the rules of :mod:`remat_opt.memory._fusion` and :mod:`remat_opt.memory._inner`).
"""

from __future__ import annotations

import dataclasses

from ..program._cost import CostModel
from ..program._graph import ProgramGraph, build_graph
from ..program._trace import TracedProgram
from ._fusion import fused_and_held, transposed_layouts
from ._inner import with_inner_bytes


def with_memory_facts(graph: ProgramGraph) -> ProgramGraph:
    """``graph`` with the memory model's facts set: fused residuals, the values
    held for them, transposed layouts, and the per-iteration bytes of scans
    whose bodies rematerialize."""
    units = list(graph.units)
    consumers = [list(c) for c in graph.consumers]
    fused, held = fused_and_held(units, list(graph.node_unit), list(graph.residual), list(graph.buffer),
                                 consumers, list(graph.reduced))
    transposed = transposed_layouts(units, list(graph.node_unit), list(graph.node_shape))
    return with_inner_bytes(dataclasses.replace(graph, fused=fused, held=held, transposed=transposed))


def model_graph(traced: TracedProgram, cost_model: CostModel | None = None) -> ProgramGraph:
    """The program graph of ``traced`` (:func:`remat_opt.program.build_graph`)
    with the memory model's facts (:func:`with_memory_facts`)."""
    return with_memory_facts(build_graph(traced, cost_model))
