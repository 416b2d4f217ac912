"""What one checkpointed stage saves: the least recompute under a cap on its saved bytes.

A stage of the program (a layer, a block) run under ``jax.checkpoint`` with a
``save_only_these_names`` policy keeps its inputs and the named values it
saves; its backward recomputes, from those, every residual it does not save.
:func:`stage_model` is that choice as a CP-SAT model over the stage alone:

* every residual the stage makes (but does not hand to the next stage) is
  saved or recomputed;
* a recomputed unit's inputs made in the stage are saved or recomputed in turn;
* the saved buffers' bytes stay under a cap (one literal per cap, to assume);
* the objective is the recomputed units' weight, then the saved bytes.

The weight is what recomputing a unit costs: its FLOPs
(:mod:`remat_opt.solve._block_solve`) or its time on the device
(:class:`remat_opt.program._roofline.RooflineCostModel`, for the step-time
search). A model may hold several stages, each checkpointed on its own, under
one cap on the bytes they save together: :func:`layer_saves` solves a
program's layers so, and :func:`layer_names` names what each saves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from ..program._graph import ProgramGraph
from ..program._names import parse_value_name
from ._blocks import crossing_values, value_spans
from ._encoding import save_candidates
from ._layers import Layers


@dataclass
class StageModel:
    """A stage's CP-SAT model: its save literals (by node), one literal per cap, and the bytes
    it could save in all."""

    model: cp_model.CpModel
    save: dict[int, cp_model.IntVar]
    caps: list[cp_model.IntVar]
    total_bytes: int

    def solve(self, cap: int, seconds: float = 1.0, seed: int = 0) -> frozenset[int] | None:
        """The saved nodes under cap literal ``cap``; ``None`` if the solver found no plan.
        Deterministic: one worker, a deterministic-time limit of ``seconds``, ``seed``."""
        self.model.clear_assumptions()
        self.model.add_assumptions([self.caps[cap]])
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers, p.random_seed, p.max_deterministic_time, p.max_time_in_seconds = 1, seed, seconds, 10 * seconds
        if solver.solve(self.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return frozenset(v for v, s in self.save.items() if solver.value(s))


def saveable(graph: ProgramGraph, own: Collection[int], exits: Collection[int],
             candidates: Sequence[int]) -> list[int]:
    """The ``candidates`` a stage may save: made in it (``own``), not handed on (``exits``, stored by
    the cut), nor laid over another stage's buffer; in ``candidates``' order."""
    return [v for v in candidates if v in own and v not in exits and graph.buffer[v] in own]


@dataclass(frozen=True)
class Stage:
    """One checkpointed stage: its units, the positions ``[lo, hi)`` it spans, and the nodes it
    hands on (stored by the cut at its end)."""

    units: tuple[int, ...]
    lo: int
    hi: int
    exits: frozenset[int]


def stage_model(graph: ProgramGraph, stages: Sequence[Stage], candidates: Sequence[int],
                weight: Mapping[int, int], caps: Sequence[int]) -> StageModel:
    """The model of ``stages``, each checkpointed on its own, their saved bytes summed under one
    cap (see the module docstring).

    Args:
        candidates: nodes that may be saved by name.
        weight: per unit, the cost of recomputing it (units absent cost nothing).
        caps: caps on the saved bytes of all stages, one literal each in :attr:`StageModel.caps`.
    """
    g, m = graph, cp_model.CpModel()
    save: dict[int, cp_model.IntVar] = {}
    rc: dict[int, cp_model.IntVar] = {}
    for stage in stages:
        own = {v for x in stage.units for v in g.units[x].outputs}
        save.update({v: m.new_bool_var(f"s{v}") for v in saveable(graph, own, stage.exits, candidates)})
        rc.update({x: m.new_bool_var(f"r{x}") for x in stage.units})
        _recompute_or_save(m, g, stage, own, save, rc)
    buffers: dict[int, cp_model.IntVar] = {}
    for v, s in save.items():
        buffers.setdefault(g.buffer[v], m.new_bool_var(f"b{g.buffer[v]}"))
        m.add_implication(s, buffers[g.buffer[v]])
    total = sum(g.node_bytes[b] for b in buffers)
    saved_bytes = sum(g.node_bytes[b] * y for b, y in buffers.items())
    cap_literals = [m.new_bool_var(f"cap{k}") for k in range(len(caps))]
    for cap, lit in zip(caps, cap_literals):
        m.add(saved_bytes <= cap).only_enforce_if(lit)
    quantum = max(1, -(-total // 1000))
    scale = max(1, -(-sum(weight.get(x, 0) for x in rc) * (total // quantum + 1) // 2**60))  # within int64
    cost = sum((weight[x] // scale) * r for x, r in rc.items() if x in weight)
    m.minimize((total // quantum + 1) * cost + sum((g.node_bytes[b] // quantum) * y for b, y in buffers.items()))
    return StageModel(m, save, cap_literals, total)


def _recompute_or_save(m: cp_model.CpModel, g: ProgramGraph, stage: Stage, own: set[int],
                       save: dict[int, cp_model.IntVar], rc: dict[int, cp_model.IntVar]) -> None:
    """Every residual the stage makes and keeps is saved or recomputed; so is every input, made
    in the stage, of a unit it recomputes."""
    def kept(v: int) -> list[cp_model.IntVar]:
        return [rc[g.node_unit[v]], *([save[v]] if v in save else [])]

    for v in sorted(own - stage.exits):
        if g.residual[v]:
            m.add_bool_or(kept(v))
    for x in stage.units:
        for w in g.units[x].inputs:
            if stage.lo <= g.position_of(w) < stage.hi and w not in stage.exits:
                m.add_bool_or(kept(w)).only_enforce_if(rc[x])


def layer_stages(graph: ProgramGraph, layers: Layers) -> list[Stage]:
    """Each layer of ``layers`` as a :class:`Stage` of ``graph``."""
    exits_at = value_spans(graph)
    out = []
    for lo, hi in layers.spans():
        units = tuple(u.index for u in graph.units if lo <= u.position < hi)
        exits = set(crossing_values(exits_at, hi)) | {v for x in units for v in graph.units[x].outputs
                                                      if graph.is_output[v]}
        out.append(Stage(units, lo, hi, frozenset(exits)))
    return out


def layer_saves(graph: ProgramGraph, layers: Layers, caps: Sequence[int],
                seconds: float = 2.0) -> list[frozenset[int] | None]:
    """Per cap on the bytes all layers save, what each saves for the least recompute, weighted by
    the graph's unit costs (``None`` where the solver found nothing)."""
    stages = layer_stages(graph, layers)
    weight = {x: graph.units[x].flops for stage in stages for x in stage.units if x in graph.primal}
    model = stage_model(graph, stages, save_candidates(graph), weight, caps)
    return [model.solve(k, seconds) for k in range(len(caps))]


def layer_names(graph: ProgramGraph, layers: Layers, saved: frozenset[int]) -> list[tuple[str, ...]]:
    """Per layer, the names of the values of ``saved`` it makes."""
    out: list[list[str]] = [[] for _ in range(layers.count)]
    spans = layers.spans()
    for v in sorted(saved):
        name = graph.units[graph.node_unit[v]].name
        parsed = parse_value_name(name or "")
        k = next((k for k, (lo, hi) in enumerate(spans) if lo <= graph.position_of(v) < hi), None)
        if parsed is not None and name is not None and k is not None:
            out[k].append(name)
    return [tuple(names) for names in out]
