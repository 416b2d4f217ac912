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

import numpy as np

from .._schedule import Schedule
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph, per_graph
from ._block_costs import ChainCosts, SegmentTerms
from ._blocks import BlockChain, find_blocks
from ._stage_saves import Stage, StageModel, saveable, stage_model

MAX_SEGMENT_STAGES = 8
"""Stages one segment may hold: grouping blocks pays only at the tightest
budgets of deep chains (about sqrt(depth · stream bytes / block bytes))."""

GRAIN_SHARE = 2.0**-13
"""The default grain of :func:`chain_schedule`'s fronts, as a share of the budget."""

CAP_STEPS = 16
"""Caps on a block's saved bytes tried for its options (evenly spaced)."""


@dataclass(frozen=True)
class ChainPlan:
    """The dynamic program's plan: schedule, predicted FLOPs and peak (its own count)."""

    schedule: Schedule
    flops: int
    peak_bytes: int


def _block_model(graph: ProgramGraph, costs: ChainCosts, t: int) -> StageModel:
    """CP-SAT over stage ``t`` alone, cut at both ends: the fewest recomputed FLOPs
    (then saved bytes), with one cap literal per level ``k`` that caps the saved bytes at
    ``k / CAP_STEPS`` of all the stage may save (the caller assumes one)."""
    g = graph
    lo, hi = costs.bounds[t], costs.bounds[t + 1]
    exits = set(costs.crossing[t + 1])
    own = {v for x in costs.units[t] for v in g.units[x].outputs}
    total = sum(g.node_bytes[b] for b in {g.buffer[v] for v in saveable(g, own, exits, costs.save_candidates)})
    weight = {x: g.units[x].flops for x in costs.units[t] if x in g.primal}
    stage = Stage(tuple(costs.units[t]), lo, hi, frozenset(exits))
    return stage_model(g, [stage], costs.save_candidates, weight,
                       [total * k // CAP_STEPS for k in range(CAP_STEPS + 1)])


def block_options(graph: ProgramGraph, costs: ChainCosts, t: int, seconds: float = 1.0,
                  seed: int = 0) -> tuple[frozenset[int], ...]:
    """Saved sets of stage ``t``, one per level ``k`` of ``0 .. CAP_STEPS``:
    the set with the fewest recomputed FLOPs (then the fewest bytes) whose bytes
    are at most ``k / CAP_STEPS`` of all it may save (level 0 saves nothing).
    Each solve is deterministic (one worker, a deterministic-time limit of
    ``seconds``, ``seed``); a level whose solve finds nothing takes the level below."""
    model = _block_model(graph, costs, t)
    levels: list[frozenset[int]] = [frozenset()]
    for k in range(1, CAP_STEPS + 1 if model.total_bytes else 1):
        found = model.solve(k, seconds, seed)
        levels.append(found if found is not None else levels[-1])
    return tuple(levels + levels[-1:] * (CAP_STEPS + 1 - len(levels)))


class _Front:
    """Pareto points (stored bytes, FLOPs) at one stage boundary, each with the
    step that reached it (an index into :attr:`ChainSearch.steps`) and its point there."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.stored = self.flops = self.step = self.point = np.zeros(0, dtype=np.int64)

    def add(self, *columns: np.ndarray) -> None:
        if columns[0].size:
            self.parts.append(columns)

    def prune(self, grain: int) -> None:
        """Keeps the points no other point beats in both stored bytes (counted in
        ``grain``s: of the points within one grain, the fewest FLOPs) and FLOPs.
        With a grain of 1 byte, the exact Pareto set (ties: the first reached)."""
        if not self.parts:
            return
        s, f, step, point = (np.concatenate(c) for c in zip(*self.parts))
        self.parts = []
        # The fewest FLOPs per grain of stored bytes (first reached on a tie), then
        # only the grains with fewer FLOPs than every grain below.
        bucket = s // grain
        if bucket.max() > 1 << 20:  # too many grains for a table: number the ones used
            _, bucket = np.unique(bucket, return_inverse=True)
        size = int(bucket.max()) + 1
        least = np.full(size, np.iinfo(np.int64).max)
        np.minimum.at(least, bucket, f)
        first = np.full(size, len(f))
        hit = np.flatnonzero(f == least[bucket])
        np.minimum.at(first, bucket[hit], hit)
        used = np.flatnonzero(first < len(f))
        fb = least[used]
        below = np.minimum.accumulate(np.concatenate(([np.iinfo(np.int64).max], fb[:-1])))
        keep = first[used[fb < below]]
        self.stored, self.flops, self.step, self.point = s[keep], f[keep], step[keep], point[keep]


class ChainSearch:
    """The dynamic program of :func:`chain_schedule` on one graph, chain and option set."""

    def __init__(self, graph: ProgramGraph, chain: BlockChain, costs: ChainCosts | None = None,
                 options: dict[tuple[str, int], tuple[frozenset[int], ...]] | None = None,
                 max_stages: int = MAX_SEGMENT_STAGES):
        self.graph, self.chain = graph, chain
        self.costs = costs or ChainCosts(graph, chain)
        # Each part of the reference block (a middle one where there is one) is solved
        # once, for every block; each prefix and suffix stage for itself.
        first = self.costs.first_block + (self.costs.per_block if chain.count >= 3 else 0)
        self.references = {("block", t - first): t for t in range(first, first + self.costs.per_block)}
        self.references.update({("outer", t): t for t in range(self.costs.num_stages)
                                if self.costs.block_of_stage(t) is None})
        self.options = options if options is not None else {
            key: block_options(graph, self.costs, t) for key, t in self.references.items()}
        self.max_stages = max_stages
        self._step_memo: dict[tuple[int, bool], tuple] = {}
        self._term_memo: dict[tuple, SegmentTerms] = {}

    def _part(self, t: int) -> tuple[str, int]:
        if self.costs.block_of_stage(t) is None:
            return ("outer", t)
        return ("block", self.costs.part_of_stage(t))

    def _saved_of(self, t: int, u: int, level: int) -> dict[int, frozenset[int]]:
        """Per stage of stages ``t .. u - 1``, the nodes its option ``level`` saves."""
        out = {}
        for s in range(t, u):
            part = self._part(s)
            nodes = self.options[part][level]
            if nodes:
                out[s] = self.costs.shift(nodes, s, self.references[part]) if part[0] == "block" else nodes
        return out

    def _steps(self, t: int, names: bool) -> tuple[tuple[int, int, bool, dict[int, frozenset[int]]], ...]:
        """Fenced segments from boundary ``t``: (end, option level, names saved, saved_of),
        one per distinct saved set (found once per search)."""
        if (t, names) in self._step_memo:
            return self._step_memo[t, names]
        out = []
        last = self.costs.num_stages - 1  # the last segment holds at least the last stage
        for u in range(t + 1, min(t + self.max_stages, last) + 1):
            seen: set[tuple] = set()
            for level in range(CAP_STEPS + 1 if names else 1):
                saved_of = self._saved_of(t, u, level)
                key = tuple(sorted(saved_of.items(), key=lambda item: item[0]))
                if key not in seen:
                    seen.add(key)
                    out.append((u, level, bool(saved_of), saved_of))
        self._step_memo[t, names] = tuple(out)
        return self._step_memo[t, names]

    def _terms(self, t: int, u: int, level: int, names: bool, before_tail: bool) -> SegmentTerms:
        """The terms of the segment of stages ``t .. u - 1`` at option ``level``,
        before another fenced segment or before the last segment."""
        key = (t, u, level, names, before_tail)
        if key not in self._term_memo:
            self._term_memo[key] = self.costs.segment(t, u, self._saved_of(t, u, level), level, before_tail, names)
        return self._term_memo[key]

    def search(self, budget_bytes: int, names: bool, grain: int = 1) -> tuple[int, tuple] | None:
        """The least FLOPs and the final step ``(t, bit, level, point, u)``, among plans
        that save names (``names``) or none; fronts pruned at ``grain`` bytes."""
        g, costs = self.graph, self.costs
        room = budget_bytes - g.input_bytes - g.output_bytes
        fronts = {(t, bit): _Front() for t in range(costs.num_stages) for bit in (0, 1)}
        fronts[0, 0].add(*(np.zeros(1, dtype=np.int64) for _ in range(4)))
        self.steps: list[tuple[int, int, int]] = []  # (boundary, names bit, option level)
        best: tuple[int, tuple] | None = None
        if not names and costs.tail_bytes[0] <= room:
            best = (0, (0, 0, 0, 0, None))
        for t in range(costs.num_stages - 1):
            for bit in (0, 1):
                front = fronts[t, bit]
                front.prune(grain)
                stored, flops = front.stored, front.flops
                if not stored.size:
                    continue
                for u, o, saves, saved_of in self._steps(t, names):
                    self.steps.append((t, bit, o))
                    mid = self._terms(t, u, o, names, False)
                    fits = np.flatnonzero(stored + mid.added_bytes + mid.local_bytes <= room)
                    fronts[u, bit | saves].add(stored[fits] + mid.added_bytes, flops[fits] + mid.flops,
                                               np.full(fits.size, len(self.steps) - 1), fits)
                    if int(np.min(stored)) + costs.tail_bytes[u] > room:  # the last segment from u cannot fit
                        continue
                    end = self._terms(t, u, o, names, True)
                    top = stored + end.added_bytes + max(end.local_bytes, costs.tail_bytes[u])
                    fits = np.flatnonzero(top <= room)
                    if fits.size and (bit | saves) == names:
                        i = int(fits[np.argmin(flops[fits])])
                        total = int(flops[i]) + end.flops
                        if best is None or total < best[0]:
                            best = (total, (t, bit, o, i, u))
        self._fronts = fronts
        return best

    def schedule(self, end: tuple, names: bool) -> tuple[Schedule, int]:
        """The schedule :meth:`search` ended at ``end``, and its peak by the chain's terms."""
        t, bit, o, i, u = end
        if u is None:
            return Schedule(), self.graph.input_bytes + self.graph.output_bytes + self.costs.tail_bytes[0]
        segments = [(t, u, o, True)]
        while t > 0:
            front = self._fronts[t, bit]
            t0, bit0, o0 = self.steps[int(front.step[i])]
            segments.append((t0, t, o0, False))
            t, bit, i = t0, bit0, int(front.point[i])
        cuts: set[int] = set()
        saved: set[int] = set()
        stored, peak = 0, 0
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
                   search: ChainSearch | None = None, grain: int | None = None) -> ChainPlan | None:
    """The plan of least recompute in the block plan space (see the module
    docstring) whose peak, by the chain's terms, fits ``budget_bytes``; ``None``
    when none fits. Plans that save names and plans that save none are searched
    apart, because the model counts transients differently in each.

    ``grain``: the fronts keep, of the points whose stored bytes fall within one
    grain, the one with the fewest FLOPs (:data:`GRAIN_SHARE` of the budget by
    default; 1 for the exact optimum of the plan space, slower on deep chains).
    The plan's bytes are counted exactly either way.
    """
    search = search or ChainSearch(graph, chain)
    grain = max(1, int(budget_bytes * GRAIN_SHARE)) if grain is None else grain
    found = []
    for names in (False, True):
        best = search.search(budget_bytes, names, grain)
        if best is not None:
            schedule, peak = search.schedule(best[1], names)
            found.append(ChainPlan(schedule, best[0], peak))
    return min(found, key=lambda p: p.flops, default=None)


_SEARCHES: dict[int, ChainSearch | None] = {}


def _search_of(graph: ProgramGraph) -> ChainSearch | None:
    """The graph's block chain and its options, found once per graph (a plan's
    retries solve the same graph under other targets)."""
    def search() -> ChainSearch | None:
        chain = find_blocks(graph)
        return None if chain is None else ChainSearch(graph, chain)

    return per_graph(_SEARCHES, graph, search)


def block_start(graph: ProgramGraph, budget_bytes: int) -> ChainPlan | None:
    """The block decomposition's plan for ``budget_bytes``, checked by the
    planning model; ``None`` for a program without identical blocks, or when
    no plan of that space fits."""
    search = _search_of(graph)
    if search is None:
        return None
    plan = chain_schedule(graph, search.chain, budget_bytes, search)
    if plan is None or simulate(graph, plan.schedule, planning=True).peak_bytes > budget_bytes:
        return None
    return plan
