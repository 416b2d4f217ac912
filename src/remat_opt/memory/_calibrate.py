"""Calibration: the model's one parameter fitted to XLA's peak for the program as written."""

from __future__ import annotations

import dataclasses

from .._schedule import Schedule
from ..program._graph import ProgramGraph
from ._simulate import simulate, simulated


def calibrate(graph: ProgramGraph, plain_peak_bytes: int) -> ProgramGraph:
    """The graph with its plain-storage scale fitted to XLA's peak for the plain program.

    Code that runs as written (the plain program, and every plan's last
    segment) is where XLA's fusion differs most from the model: it keeps the
    operands of cheap values it fuses into their readers (the attention
    scores behind a softmax, the matmul outputs behind a residual stream) on
    top of the residuals. Measuring the plain program is part of every plan
    anyway; its error, spread over the residual bytes the model stores for
    it, scales those bytes wherever code runs as written. Clamped to [0.5, 2].

    Two scales, one per model, each fitted under its own rules: the
    prediction's nets the last segment's transient of the residuals freed by
    then, the planning model's (CP-SAT's) charges it whole. One scale shared
    by both made CP-SAT's model stricter than XLA once the prediction netted
    it (docs/measurements.md, "The last segment's transient").

    Args:
        graph: the program graph (uncalibrated).
        plain_peak_bytes: XLA's peak for the program as written.

    Returns:
        ``graph`` with ``plain_storage_scale`` and ``planning_storage_scale`` set.
    """
    graph = dataclasses.replace(graph, plain_storage_scale=1.0, planning_storage_scale=None)
    sim = simulate(graph, Schedule(plain=True))
    stored = sum(graph.node_bytes[b] for b in {graph.buffer[v] for v in sim.stored_nodes} if b >= 0)
    if stored == 0:
        return graph
    gross = simulated(graph, Schedule(plain=True), gross_transient=True)

    def fitted(peak_bytes: int) -> float:
        return min(2.0, max(0.5, 1.0 + (plain_peak_bytes - peak_bytes) / stored))
    return dataclasses.replace(graph, plain_storage_scale=fitted(sim.peak_bytes),
                               planning_storage_scale=fitted(gross.peak_bytes))
