"""A schedule applied to the user's function: the program a plan runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._schedule import Schedule
from ..program._graph import ProgramGraph
from ..program._trace import with_signature
from ._rewrite import rewrite


def apply_schedule(
    fn: Callable[..., Any], graph: ProgramGraph, schedule: Schedule, *, compute_saved_once: bool = True
) -> Callable[..., Any]:
    """``fn`` with ``schedule`` applied, for arguments of the traced signature.

    The plain schedule is ``fn`` itself, unless the flat program differs from
    it (scans were unrolled): then it is the flat program as written.
    ``compute_saved_once``: see :func:`optimize`.

    A graph of a ``shard_map`` body (:func:`remat_opt.program._manual.planned_body`) has
    its schedule applied to the body, per device, inside the same call of ``fn``'s program.
    """
    traced = graph.traced
    manual = traced.manual
    if schedule.plain and not (manual.outer if manual is not None else traced).unrolled_scans:
        return fn
    program = rewrite(graph, schedule, compute_saved_once=compute_saved_once)
    if manual is None:
        return with_signature(fn, traced, program)
    return with_signature(fn, manual.outer, manual.outer_program(program))
