"""What a scan body saves, chosen by CP-SAT: a ``save_only_these_names`` policy.

A loop body under ``jax.checkpoint(body, policy=save_only_these_names(*S))``
stores, per iteration, the values named in ``S`` that its backward needs;
every other value the backward needs is recomputed there, from the saved
values and the body's inputs (which the loop keeps anyway: its consts and
scanned inputs, and one carry per iteration). JAX recomputes exactly what
is needed, nothing more. So on the body's graph
(:mod:`remat_opt.program._scan_body`):

* ``s[n]``: named value ``n`` is saved (only values the rewriter names can be);
* ``r[u]``: equation ``u`` runs again in the backward;
* a residual (a value the backward reads) is saved or its equation re-runs;
* an equation that re-runs has each operand saved, re-run, or a body input;
* the saved bytes fit ``cap_bytes``, the memory one iteration may keep;
* minimize the FLOPs re-run (plus, where a ``store`` cost is given, what
  keeping the saved values costs, in the same units), then the bytes saved.

The loop multiplies both by its length; the caller sets ``cap_bytes`` from the
budget and XLA's measurements (:mod:`remat_opt.planner._loop_planning`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ortools.sat.python import cp_model

from ._solve import SolverOptions, _run, _solver
from ..program._graph import ProgramGraph
from ..program._names import parse_value_name


@dataclass(frozen=True)
class BodyChoice:
    """The saved set CP-SAT chose for one iteration of a loop body.

    Attributes:
        saved: the names to save, sorted (``remat_opt/{i}/{k}``, see
            :func:`remat_opt.program._names.value_name`).
        saved_bytes: their bytes, per iteration.
        recompute_flops: FLOPs the backward re-runs, per iteration.
        status: ``"OPTIMAL"`` or ``"FEASIBLE"`` (stopped on a limit).
        gap: relative gap of ``recompute_flops`` to the solver's bound.
    """

    saved: tuple[str, ...]
    saved_bytes: int
    recompute_flops: int
    status: str
    gap: float


def saveable_nodes(graph: ProgramGraph) -> dict[int, str]:
    """The values a names policy can save: each named by the rewriter, by node id."""
    out = {}
    for unit in graph.units:
        if unit.primitive == "name" and unit.name and parse_value_name(unit.name):
            out[unit.outputs[0]] = unit.name
    return out


def choose_saved(graph: ProgramGraph, cap_bytes: int, options: SolverOptions = SolverOptions(),
                 store: Mapping[int, int] | None = None) -> BodyChoice:
    """The saved set with the fewest re-run FLOPs (plus ``store`` costs of what it saves, by node)
    whose bytes fit ``cap_bytes``.

    Saving nothing is always feasible (every residual can be re-run from the
    body's inputs), so a cap of 0 or less gives the empty set.
    """
    saveable = saveable_nodes(graph)
    model = cp_model.CpModel()
    rerun = [model.new_bool_var(f"r{u.index}") for u in graph.units]
    save = {n: model.new_bool_var(f"s{n}") for n in saveable}

    def available(n: int) -> list[cp_model.IntVar]:
        return [rerun[graph.node_unit[n]], *([save[n]] if n in save else [])]

    for n, is_residual in enumerate(graph.residual):
        if is_residual:
            model.add_bool_or(available(n))
    for unit in graph.units:
        for n in unit.inputs:
            model.add_bool_or(available(n)).only_enforce_if(rerun[unit.index])
    model.add(sum(graph.node_bytes[n] * s for n, s in save.items()) <= max(0, int(cap_bytes)))
    # Fewest FLOPs first; among equals, fewest bytes (in quanta, so the weights stay in range).
    quantum = max(1, math.ceil(sum(graph.node_bytes[n] for n in save) / 1000))
    quanta = {n: math.ceil(graph.node_bytes[n] / quantum) for n in save}
    weight = sum(quanta.values()) + 1
    flops = sum(u.flops * r for u, r in zip(graph.units, rerun))
    kept = sum((store or {}).get(n, 0) * s for n, s in save.items())
    model.minimize(weight * (flops + kept) + sum(quanta[n] * s for n, s in save.items()))
    for r in rerun:  # start from saving nothing: feasible at any cap
        model.add_hint(r, True)
    for s in save.values():
        model.add_hint(s, False)
    solver = _solver(options)
    status = _run(solver, model, options)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT found no saved set for the loop body (status {solver.status_name(status)}).")
    chosen = sorted((n for n, s in save.items() if solver.value(s)), key=lambda n: saveable[n])
    flops_value = sum(u.flops for u, r in zip(graph.units, rerun) if solver.value(r))
    bound = solver.best_objective_bound / weight
    gap = 0.0 if status == cp_model.OPTIMAL or flops_value == 0 else max(0.0, 1 - bound / flops_value)
    return BodyChoice(
        saved=tuple(saveable[n] for n in chosen),
        saved_bytes=sum(graph.node_bytes[n] for n in chosen),
        recompute_flops=flops_value,
        status="OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE",
        gap=gap,
    )
