"""Calibration: the model's one parameter fitted to XLA's peak for the program as written."""

from __future__ import annotations

import dataclasses

from .._schedule import Schedule
from ..program._graph import ProgramGraph
from ._simulate import simulate


def calibrate(graph: ProgramGraph, plain_peak_bytes: int) -> ProgramGraph:
    """The graph with its plain-storage scale fitted to XLA's peak for the plain program.

    Code that runs as written (the plain program, and every plan's last
    segment) is where XLA's fusion differs most from the model: it keeps the
    operands of cheap values it fuses into their readers (the attention
    scores behind a softmax, the matmul outputs behind a residual stream) on
    top of the residuals. Measuring the plain program is part of every plan
    anyway; its error, spread over the residual bytes the model stores for
    it, scales those bytes wherever code runs as written. Clamped to [0.5, 2].

    Args:
        graph: the program graph (uncalibrated).
        plain_peak_bytes: XLA's peak for the program as written.

    Returns:
        ``graph`` with ``plain_storage_scale`` set.
    """
    graph = dataclasses.replace(graph, plain_storage_scale=1.0)
    sim = simulate(graph, Schedule(plain=True))
    stored = sum(graph.node_bytes[b] for b in {graph.buffer[v] for v in sim.stored_nodes} if b >= 0)
    if stored == 0:
        return graph
    scale = 1.0 + (plain_peak_bytes - sim.peak_bytes) / stored
    return dataclasses.replace(graph, plain_storage_scale=min(2.0, max(0.5, scale)))
