"""What one checkpointed stage saves: the least recompute under a cap on its saved bytes.

A stage of the program (a layer, a block) run under ``jax.checkpoint`` with a
``save_only_these_names`` policy keeps its inputs and the named values it
saves; its backward recomputes, from those, every residual it does not save.
:func:`stage_model` is that choice as a CP-SAT model over the stage alone:

* every residual the stage makes (but does not hand to the next stage) is
  saved or recomputed;
* a recomputed unit's inputs made in the stage are saved or recomputed in turn;
* the saved buffers' bytes stay under a cap (one literal per cap, to assume);
* the objective is the recomputed units' weight plus what keeping the saved
  values costs (``store``, where given), then the saved bytes.

The weight is what recomputing a unit costs: its FLOPs
(:mod:`remat_opt.solve._block_solve`) or its time on the device
(:class:`remat_opt.program._roofline.RooflineCostModel`, for the step-time
search, whose ``store`` is the time of writing and reading a saved value back:
:func:`remat_opt.planner._saved_bytes.store_costs`). A model may hold several
stages, each checkpointed on its own, under one cap on the bytes they save
together. :func:`layer_saves` solves a program's layers, each under its share of
a cap; :func:`layer_names` names what each saves; :func:`recomputed_units` is
what a stage runs again for a given saved set.
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
                weight: Mapping[int, int], caps: Sequence[int],
                store: Mapping[int, int] | None = None) -> StageModel:
    """The model of ``stages``, each checkpointed on its own, their saved bytes summed under one
    cap (see the module docstring).

    Args:
        candidates: nodes that may be saved by name.
        weight: per unit, the cost of recomputing it (units absent cost nothing).
        caps: caps on the saved bytes of all stages, one literal each in :attr:`StageModel.caps`.
        store: per node, the cost of keeping it, in ``weight``'s units (a buffer costs its
            dearest saved node's; nodes absent cost nothing).
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
    kept: dict[int, int] = {}  # per buffer, what keeping it costs
    for v, s in save.items():
        buffers.setdefault(g.buffer[v], m.new_bool_var(f"b{g.buffer[v]}"))
        m.add_implication(s, buffers[g.buffer[v]])
        kept[g.buffer[v]] = max(kept.get(g.buffer[v], 0), (store or {}).get(v, 0))
    total = sum(g.node_bytes[b] for b in buffers)
    saved_bytes = sum(g.node_bytes[b] * y for b, y in buffers.items())
    cap_literals = [m.new_bool_var(f"cap{k}") for k in range(len(caps))]
    for cap, lit in zip(caps, cap_literals):
        m.add(saved_bytes <= cap).only_enforce_if(lit)
    quantum = max(1, -(-total // 1000))
    most = sum(weight.get(x, 0) for x in rc) + sum(kept.values())
    scale = max(1, -(-most * (total // quantum + 1) // 2**60))  # within int64
    cost = sum((weight[x] // scale) * r for x, r in rc.items() if x in weight) + \
        sum((kept[b] // scale) * y for b, y in buffers.items())
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


def layer_saves(graph: ProgramGraph, layers: Layers, caps: Sequence[int], seconds: float = 20.0,
                store: Mapping[int, int] | None = None) -> list[frozenset[int] | None]:
    """Per cap on the bytes all layers save, what each saves for the least recompute (plus, where
    ``store`` is given, the least cost of keeping what it saves: see :func:`stage_model`),
    weighted by the graph's unit costs (``None`` where the solver found nothing).

    Each layer gets the share of the cap that its saveable bytes are of all layers', and is
    solved on its own (a model of one layer is solved to optimality in well under a second;
    one of all layers together, with their symmetry, is not). Layers alike
    (:func:`stage_signature`) are solved once, under the least of their shares: the others save
    the same values, moved over (those they may save)."""
    stages = layer_stages(graph, layers)
    weight = {x: graph.units[x].flops for stage in stages for x in stage.units if x in graph.primal}
    candidates = save_candidates(graph)
    own = [set(saveable(graph, {v for x in st.units for v in graph.units[x].outputs}, st.exits, candidates))
           for st in stages]
    sizes = [sum(graph.node_bytes[v] for v in vs) for vs in own]
    share = [b / (sum(sizes) or 1) for b in sizes]
    alike: dict[tuple, list[int]] = {}
    for k, stage in enumerate(stages):
        alike.setdefault(stage_signature(graph, stage), []).append(k)
    out: list[set[int] | None] = [set() for _ in caps]
    for members in alike.values():
        first, least = stages[members[0]], min(share[k] for k in members)
        model = stage_model(graph, [first], candidates, weight, [int(least * c) for c in caps], store)
        for j in range(len(caps)):
            saved, kept = model.solve(j, seconds), out[j]
            if saved is None or kept is None:
                out[j] = None
                continue
            for k in members:
                kept.update(_moved(graph, first, stages[k], saved) & own[k])
    return [None if kept is None else frozenset(kept) for kept in out]


def stage_signature(graph: ProgramGraph, stage: Stage) -> tuple:
    """What a stage computes, up to which values it reads from outside: per unit, its primitive,
    its outputs' bytes, whether each is a residual or handed on, and where each input comes from
    (a unit of the stage, by rank, or outside it, by bytes). Two stages alike have equal ones."""
    rank = {x: k for k, x in enumerate(stage.units)}
    out = []
    for x in stage.units:
        unit = graph.units[x]
        inputs = tuple((rank[graph.node_unit[w]], graph.units[graph.node_unit[w]].outputs.index(w))
                       if graph.node_unit[w] in rank else ("outside", graph.node_bytes[w]) for w in unit.inputs)
        outputs = tuple((graph.node_bytes[v], graph.residual[v], v in stage.exits) for v in unit.outputs)
        out.append((unit.primitive, inputs, outputs))
    return tuple(out)


def _moved(graph: ProgramGraph, source: Stage, target: Stage, saved: frozenset[int]) -> set[int]:
    """``saved``, nodes of stage ``source``, as the same nodes of ``target`` (a stage alike)."""
    where = {v: (k, i) for k, x in enumerate(source.units) for i, v in enumerate(graph.units[x].outputs)}
    return {graph.units[target.units[where[v][0]]].outputs[where[v][1]] for v in saved}


def recomputed_units(graph: ProgramGraph, stage: Stage, saved: Collection[int]) -> frozenset[int]:
    """The units ``stage``'s backward runs again when it saves ``saved``: each that makes a residual
    the stage neither saves nor hands on, and, in turn, each that makes an input (made in the
    stage, not saved, not handed on) of a unit it runs again. JAX's checkpoint reruns exactly
    these: the least set :func:`stage_model`'s constraints allow for this saved set."""
    def needed(v: int) -> bool:
        return stage.lo <= graph.position_of(v) < stage.hi and v not in stage.exits and v not in saved

    stack = [graph.node_unit[v] for x in stage.units for v in graph.units[x].outputs
             if graph.residual[v] and needed(v)]
    done: set[int] = set()
    while stack:
        x = stack.pop()
        if x not in done:
            done.add(x)
            stack += [graph.node_unit[w] for w in graph.units[x].inputs if needed(w)]
    return frozenset(done)


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
