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
    """
    if schedule.plain and not graph.traced.unrolled_scans:
        return fn
    return with_signature(fn, graph.traced, rewrite(graph, schedule, compute_saved_once=compute_saved_once))
