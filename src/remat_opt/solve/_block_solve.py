"""Plans for a chain of identical blocks: one block solved once, the chain by dynamic programming.

A deep unrolled model is one block repeated (:mod:`remat_opt.solve._blocks`).
Its plans are found in two steps, whatever the depth:

1. **The block's options.** What one block saves by name, when it is a fenced
   segment of its own: a small CP-SAT model over that block alone chooses the
   saved set with the fewest recomputed FLOPs under a cap on the saved bytes,
   for a grid of caps (:func:`block_options`). Each set is one option; saving
   nothing is always one.
2. **The chain.** Segments are runs of whole stages (prefix, blocks, suffix),
   each of up to :data:`MAX_SEGMENT_STAGES` stages, with one option for all
   its blocks; the last segment runs as written. A segment's peak is the bytes
   earlier segments stored plus its own terms (:mod:`remat_opt.solve._block_costs`),
   so a dynamic program over the stage boundaries, keeping at each one the
   Pareto set of (stored bytes, recomputed FLOPs), finds the plan of least
   recompute whose every segment fits (:func:`chain_schedule`). It is exact
   in that plan space: a test holds it equal to brute force on small chains.

The schedule is an ordinary :class:`Schedule` (cuts and saved names), checked
by :func:`remat_opt.memory._simulate.simulate` like any other; the whole-graph
CP-SAT starts from it (:func:`remat_opt.solve._solve.solve`).

References:
    Beaumont et al., "Optimal checkpointing for heterogeneous chains: how to
    train deep neural networks with limited memory" (Rotor), 2019; Zhao et al.,
    "Rockmate: an Efficient, Fast, Automatic and Generic Tool for
    Re-materialization in PyTorch", ICML 2023.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from ortools.sat.python import cp_model

from ._block_costs import ChainCosts
from ._blocks import BlockChain
from ._encoding import save_candidates
from ..program._graph import ProgramGraph
from .._schedule import Schedule

MAX_SEGMENT_STAGES = 8
"""Stages one segment may hold: grouping blocks pays only at the tightest
budgets of deep chains (about sqrt(depth · stream bytes / block bytes))."""

CAP_STEPS = 16
"""Caps on a block's saved bytes tried for its options (evenly spaced)."""


@dataclass(frozen=True)
class ChainPlan:
    """The dynamic program's plan: schedule, predicted FLOPs and peak (its own count)."""

    schedule: Schedule
    flops: int
    peak_bytes: int


def _block_model(graph: ProgramGraph, costs: ChainCosts, t: int, cap_bytes: int) -> tuple[cp_model.CpModel, dict]:
    """CP-SAT over block stage ``t`` alone, cut at both ends: the fewest recomputed
    FLOPs (then saved bytes) with at most ``cap_bytes`` saved by name."""
    g, m = graph, cp_model.CpModel()
    lo, hi = costs.bounds[t], costs.bounds[t + 1]
    exits = set(costs.crossing[t + 1])
    own = {v for x in costs.units[t] for v in g.units[x].outputs}
    # Not the block's outputs (stored by the cut), nor values laid over another block's buffer.
    saveable = [v for v in save_candidates(g) if v in own and v not in exits and g.buffer[v] in own]
    save = {v: m.NewBoolVar(f"s{v}") for v in saveable}
    rc = {x: m.NewBoolVar(f"r{x}") for x in costs.units[t]}

    def kept(v: int) -> list:
        return [rc[g.node_unit[v]], *([save[v]] if v in save else [])]

    for v in sorted(own - exits):
        if g.residual[v]:
            m.AddBoolOr(kept(v))
    for x in costs.units[t]:
        for w in g.units[x].inputs:
            if lo <= g.position_of(w) < hi and w not in exits:
                m.AddBoolOr(kept(w)).OnlyEnforceIf(rc[x])
    buffers: dict[int, cp_model.IntVar] = {}
    for v, s in save.items():
        buffers.setdefault(g.buffer[v], m.NewBoolVar(f"b{g.buffer[v]}"))
        m.AddImplication(s, buffers[g.buffer[v]])
    total = sum(g.node_bytes[b] for b in buffers)
    m.Add(sum(g.node_bytes[b] * y for b, y in buffers.items()) <= cap_bytes)
    quantum = max(1, -(-total // 1000))
    flops = sum(g.units[x].flops * r for x, r in rc.items() if x in g.primal)
    m.Minimize((total // quantum + 1) * flops + sum((g.node_bytes[b] // quantum) * y for b, y in buffers.items()))
    return m, save


def saveable_bytes(graph: ProgramGraph, costs: ChainCosts, t: int) -> int:
    """Bytes of everything block stage ``t`` may save (see :func:`_block_model`)."""
    _, save = _block_model(graph, costs, t, 0)
    return sum(graph.node_bytes[b] for b in {graph.buffer[v] for v in save})


def block_options(graph: ProgramGraph, costs: ChainCosts, t: int, seconds: float = 1.0,
                  seed: int = 0) -> tuple[frozenset[int], ...]:
    """Saved sets of block stage ``t``, one per level ``k`` of ``0 .. CAP_STEPS``:
    the set with the fewest recomputed FLOPs (then the fewest bytes) whose bytes
    are at most ``k / CAP_STEPS`` of all it may save (level 0 saves nothing).
    Each solve is deterministic (one worker, a deterministic-time limit of
    ``seconds``, ``seed``); a level whose solve finds nothing takes the level below."""
    total = saveable_bytes(graph, costs, t)
    levels = [frozenset()]
    for k in range(1, CAP_STEPS + 1):
        model, save = _block_model(graph, costs, t, total * k // CAP_STEPS)
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers, p.random_seed, p.max_deterministic_time, p.max_time_in_seconds = 1, seed, seconds, 10 * seconds
        found = solver.Solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        levels.append(frozenset(v for v, s in save.items() if solver.Value(s)) if found else levels[-1])
    return tuple(levels)


class _Front:
    """Pareto points (stored bytes, FLOPs) at one stage boundary, with the step that reached each."""

    def __init__(self) -> None:
        self.stored: list[int] = []
        self.flops: list[int] = []
        self.back: list[tuple] = []

    def add(self, stored: np.ndarray, flops: np.ndarray, back: list[tuple]) -> None:
        self.stored += stored.tolist()
        self.flops += flops.tolist()
        self.back += back

    def prune(self) -> None:
        """Keeps the points no other point beats in both (ties: the first reached)."""
        if not self.stored:
            return
        s, f = np.asarray(self.stored), np.asarray(self.flops)
        order = np.lexsort((np.arange(len(s)), f, s))
        fs = f[order]
        best_before = np.minimum.accumulate(np.concatenate(([np.iinfo(np.int64).max], fs[:-1])))
        keep = order[fs < best_before]
        self.stored, self.flops = s[keep].tolist(), f[keep].tolist()
        self.back = [self.back[k] for k in keep]


class ChainSearch:
    """The dynamic program of :func:`chain_schedule` on one graph, chain and option set."""

    def __init__(self, graph: ProgramGraph, chain: BlockChain, costs: ChainCosts | None = None,
                 options: tuple[frozenset[int], ...] | None = None, max_stages: int = MAX_SEGMENT_STAGES):
        self.graph, self.chain = graph, chain
        self.costs = costs or ChainCosts(graph, chain)
        # Each part of the reference block (a middle one where there is one) is solved once.
        first = self.costs.first_block + (self.costs.per_block if chain.count >= 3 else 0)
        self.references = tuple(range(first, first + self.costs.per_block))
        self.options = options if options is not None else tuple(
            block_options(graph, self.costs, r) for r in self.references)
        self.max_stages = max_stages

    def _saved_of(self, t: int, u: int, level: int) -> dict[int, frozenset[int]]:
        """Per block stage of stages ``t .. u - 1``, the nodes its option ``level`` saves."""
        out = {}
        for s in range(t, u):
            if self.costs.block_of_stage(s) is not None:
                part = self.costs.part_of_stage(s)
                nodes = self.options[part][level]
                if nodes:
                    out[s] = self.costs.shift(nodes, s, self.references[part])
        return out

    def _steps(self, t: int, names: bool):
        """Fenced segments from boundary ``t``: (end, option level, names saved, saved_of),
        one per distinct saved set."""
        last = self.costs.num_stages - 1  # the last segment holds at least the last stage
        for u in range(t + 1, min(t + self.max_stages, last) + 1):
            seen: set[tuple] = set()
            for level in range(len(self.options[0]) if names else 1):
                saved_of = self._saved_of(t, u, level)
                key = tuple(sorted(saved_of.items(), key=lambda item: item[0]))
                if key not in seen:
                    seen.add(key)
                    yield u, level, bool(saved_of), saved_of

    def search(self, budget_bytes: int, names: bool) -> tuple[int, tuple] | None:
        """The least FLOPs and the final step, among plans that save names (``names``) or none."""
        g, costs = self.graph, self.costs
        room = budget_bytes - g.input_bytes - g.output_bytes
        fronts = {(t, bit): _Front() for t in range(costs.num_stages) for bit in (0, 1)}
        fronts[0, 0].add(np.array([0]), np.array([0]), [None])
        best: tuple[int, tuple] | None = None
        if not names and costs.tail_bytes[0] <= room:
            best = (0, ("end", 0, 0, 0, None))
        for t in range(costs.num_stages - 1):
            for bit in (0, 1):
                front = fronts[t, bit]
                front.prune()
                if not front.stored:
                    continue
                stored, flops = np.asarray(front.stored), np.asarray(front.flops)
                for u, o, saves, saved_of in self._steps(t, names):
                    key = (t, bit, o)
                    mid = costs.segment(t, u, saved_of, o, False, names)
                    fits = np.flatnonzero(stored + mid.added_bytes + mid.local_bytes <= room)
                    fronts[u, bit | saves].add(stored[fits] + mid.added_bytes, flops[fits] + mid.flops,
                                              [(*key, int(i), u) for i in fits])
                    end = costs.segment(t, u, saved_of, o, True, names)
                    top = stored + end.added_bytes + max(end.local_bytes, costs.tail_bytes[u])
                    fits = np.flatnonzero(top <= room)
                    if fits.size and (bit | saves) == names:
                        i = int(fits[np.argmin(flops[fits])])
                        total = int(flops[i]) + end.flops
                        if best is None or total < best[0]:
                            best = (total, ("end", *key, i, u))
        self._fronts = fronts
        return best

    def schedule(self, end: tuple, names: bool) -> tuple[Schedule, int]:
        """The schedule :meth:`search` ended at ``end``, and its peak by the chain's terms."""
        _, t, bit, o, i, u = end
        if u is None:
            return Schedule(), self.graph.input_bytes + self.graph.output_bytes + self.costs.tail_bytes[0]
        segments = [(t, u, o, True)]
        back = self._fronts[t, bit].back[i]
        while back is not None:
            t0, bit0, o0, i0, u0 = back
            segments.append((t0, u0, o0, False))
            back = self._fronts[t0, bit0].back[i0]
        cuts, saved, stored, peak = set(), set(), 0, 0
        for t, u, o, before_tail in reversed(segments):
            saved_of = self._saved_of(t, u, o)
            terms = self.costs.segment(t, u, saved_of, o, before_tail, names)
            stored += terms.added_bytes
            peak = max(peak, stored + terms.local_bytes)
            cuts.add(self.costs.bounds[u])
            saved.update(*saved_of.values())
        peak = max(peak, stored + self.costs.tail_bytes[segments[0][1]])
        base = self.graph.input_bytes + self.graph.output_bytes
        return Schedule(cuts=frozenset(c for c in cuts if c > 0), saved=frozenset(saved)), base + peak


def chain_schedule(graph: ProgramGraph, chain: BlockChain, budget_bytes: int,
                   search: ChainSearch | None = None) -> ChainPlan | None:
    """The plan of least recompute in the block plan space (see the module
    docstring) whose peak, by the chain's terms, fits ``budget_bytes``; ``None``
    when none fits. Plans that save names and plans that save none are searched
    apart, because the model counts transients differently in each.
    """
    search = search or ChainSearch(graph, chain)
    found = []
    for names in (False, True):
        best = search.search(budget_bytes, names)
        if best is not None:
            schedule, peak = search.schedule(best[1], names)
            found.append(ChainPlan(schedule, best[0], peak))
    return min(found, key=lambda p: p.flops, default=None)
