"""The planning model's terms for segments made of whole stages of a block chain.

On a chain of stages (:mod:`remat_opt.solve._blocks`: prefix, identical blocks,
suffix), a schedule whose cuts fall only between stages splits the peak of
:func:`remat_opt.memory._simulate.simulate` (``planning=True``) into parts that
each depend on one segment only:

* what a fenced segment adds to the stored bytes, live from it to the end of
  the step: the values crossing the cut it starts at, its saved names that
  its backward reads, and, before the last segment, the values crossing into
  it that only this segment's recomputation reads;
* what it holds during its own backward: its recomputed buffers, relayout
  copies, largest transient and the cotangents crossing its end;
* the last segment (run as written): its residuals, with the calibrated
  extra, the values crossing into it that its backward reads, its transient.

A segment's peak is the inputs and outputs, plus what earlier segments
added, plus its own terms. Recomputation within a segment flows backwards
from stage to stage: a stage whose input does not cross a cut asks the stage
before it for that value (:meth:`ChainCosts.stage_recompute`).

Not counted: the gradient-slot credit, which the planning model gives only to
schedules that save no names, and only lowers a peak; so for those the terms
are an upper bound, and exact for schedules that save names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..memory._fusion import materialized, read_by_backward
from ..memory._terms import kept_buffers, remat_bytes, tail_extra_bytes
from ..memory._transient import held_forward_scratch, transient_bytes
from ..program._graph import ProgramGraph
from ._blocks import BlockChain, crossing_values, stage_bounds, value_spans
from ._encoding import save_candidates


@dataclass(frozen=True)
class SegmentTerms:
    """One fenced segment: bytes added to the stored total, bytes held during its
    own backward beyond that total, and FLOPs recomputed."""

    added_bytes: int
    local_bytes: int
    flops: int


class ChainCosts:
    """The segment terms of one graph and its block chain, memoized per kind of
    segment (the stages' classes, so that interior blocks are evaluated once)."""

    def __init__(self, graph: ProgramGraph, chain: BlockChain):
        self.graph, self.chain = graph, chain
        self.bounds = stage_bounds(graph, chain)  # stage t: [bounds[t], bounds[t + 1])
        spans = value_spans(graph)
        self.crossing = [crossing_values(spans, b) for b in self.bounds]
        self.units: list[list[int]] = [[] for _ in self.bounds[:-1]]
        for u in graph.units:
            self.units[self.stage_of(u.position)].append(u.index)
        self.first_block = self.bounds.index(chain.boundary(0))
        self.per_block = self.bounds.index(chain.boundary(1)) - self.first_block  # stages per block
        self.save_candidates = save_candidates(graph)
        kept = kept_buffers(graph)
        self._remat = [remat_bytes(graph, u.index, kept) for u in graph.units]
        # Per unit: as written (the last segment), behind a fence, recomputed behind a fence.
        self._transient = [tuple(transient_bytes(graph, u.index, recomputed, fenced)
                                 for recomputed, fenced in ((False, False), (False, True), (True, True)))
                           for u in graph.units]
        self._stage_transient = [[max((self._transient[x][k] for x in us), default=0) for us in self.units]
                                 for k in (0, 1)]
        self._memo: dict[tuple, SegmentTerms] = {}

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    def stage_of(self, position: int) -> int:
        return sum(1 for b in self.bounds[1:-1] if b <= position)

    def block_of_stage(self, t: int) -> int | None:
        """The block stage ``t`` lies in, or ``None`` (prefix and suffix)."""
        k = (t - self.first_block) // self.per_block
        return k if 0 <= t - self.first_block and k < self.chain.count else None

    def part_of_stage(self, t: int) -> int:
        """Which of its block's stages stage ``t`` is (0 for prefix and suffix stages)."""
        return (t - self.first_block) % self.per_block if self.block_of_stage(t) is not None else 0

    def stage_class(self, t: int) -> tuple:
        """What a stage's terms depend on: its place in its block and the neighbouring
        blocks' existence; a prefix or suffix stage is its own class."""
        k = self.block_of_stage(t)
        if k is None:
            return ("outer", t)
        kind = "first" if k == 0 else "last" if k == self.chain.count - 1 else "mid"
        return (kind, self.part_of_stage(t))

    def shift(self, nodes: frozenset[int], t: int, reference: int) -> frozenset[int]:
        """Nodes of block stage ``reference`` moved to the same stage of ``t``'s block."""
        block, reference_block = self.block_of_stage(t), self.block_of_stage(reference)
        if block is None or reference_block is None:
            raise ValueError(f"stages {t} and {reference} must both lie in blocks.")
        step = (block - reference_block) * self.chain.node_step
        return frozenset(v + step for v in nodes)

    def stage_recompute(self, t: int, saved: frozenset[int], entry_stored: bool, exit_stored: bool,
                        demand: frozenset[int]) -> tuple[set[int], frozenset[int]]:
        """Units stage ``t`` recomputes in a fenced segment, and the values it asks
        of the stage before (its inputs that do not cross a cut).

        Args:
            saved: nodes of the stage saved by name.
            entry_stored, exit_stored: a cut at the stage's start, at its end.
            demand: values of this stage that the next stage's recomputation reads.
        """
        g, lo = self.graph, self.bounds[t]
        available = set(saved) | (set(self.crossing[t + 1]) if exit_stored else set())
        roots = [v for u in self.units[t] for v in g.units[u].outputs if g.residual[v]] + list(demand)
        stack = [g.node_unit[v] for v in roots if v not in available]
        done, asked = set(), set()
        while stack:
            u = stack.pop()
            if u in done:
                continue
            done.add(u)
            for w in g.units[u].inputs:
                if g.position_of(w) < lo:
                    if not entry_stored:
                        asked.add(w)
                elif w not in available:
                    stack.append(g.node_unit[w])
        return done, frozenset(asked)

    def segment(self, t: int, u: int, saved_of: dict[int, frozenset[int]], option: object, before_tail: bool,
                names: bool) -> SegmentTerms:
        """The terms of the fenced segment of stages ``t .. u - 1`` (see the module docstring).

        Args:
            saved_of: per block stage of the segment, its saved nodes.
            option: what ``saved_of`` was made from, for the memo (equal
                options on equal kinds of segment give equal terms).
            before_tail: the last segment starts at ``u``.
            names: the schedule saves names (transients then count no
                recomputed quotient twice, as in ``simulate``).
        """
        key = (tuple(self.stage_class(s) for s in range(t, u)), option, before_tail, names)
        if key not in self._memo:
            self._memo[key] = self._segment(t, u, saved_of, before_tail, names)
        return self._memo[key]

    def _segment(self, t: int, u: int, saved_of: dict[int, frozenset[int]], before_tail: bool,
                 names: bool) -> SegmentTerms:
        g = self.graph
        demand: frozenset[int] = frozenset()
        recomputed: set[int] = set()
        for s in reversed(range(t, u)):
            done, demand = self.stage_recompute(s, saved_of.get(s, frozenset()), s == t, s == u - 1, demand)
            recomputed |= done
        saved = frozenset().union(*saved_of.values())
        read = {w for x in recomputed for w in g.units[x].inputs}
        added = {g.buffer[v] for v in saved if g.residual[v] or v in read}
        if t > 0:  # values crossing the cut this segment starts at
            added |= {g.buffer[v] for v in self.crossing[t] if not g.is_output[v]}
        if before_tail:  # read past the last cut only by this segment's recomputation
            added |= {g.buffer[v] for v in self.crossing[u]
                      if not g.is_output[v] and not read_by_backward(g, v) and v in read}
        local = sum(self._remat[x] for x in recomputed)
        local += max([*self._stage_transient[1][t:u], *(self._transient[x][2] for x in recomputed if not names)])
        local += self._relayout(t, u, saved) + g.crossing_bytes(self.bounds[u])
        flops = sum(g.units[x].flops for x in recomputed & g.primal)
        return SegmentTerms(sum(g.node_bytes[b] for b in added if b >= 0), local, flops)

    def _relayout(self, t: int, u: int, saved: frozenset[int]) -> int:
        """Copies of transposed values the fenced segment's backward makes:
        its saved ones, and those crossing into it, once per reading position."""
        g = self.graph
        total = sum(g.node_bytes[v] for v in saved if g.transposed and g.transposed[v] and not g.is_output[v])
        if t == 0 or not g.transposed:
            return total
        lo, hi = self.bounds[t], self.bounds[u]
        for v in self.crossing[t]:
            if g.transposed[v] and not g.is_output[v]:
                total += g.node_bytes[v] * len({g.units[x].position for x in g.consumers[v]
                                                if lo <= g.units[x].position < hi})
        return total

    @cached_property
    def tail_bytes(self) -> tuple[int, ...]:
        """Per stage ``t``, what the last segment holds when it starts at ``t``
        (beyond what earlier segments added)."""
        g = self.graph
        stored = [(g.position_of(v), g.buffer[v]) for v in range(g.num_nodes)
                  if materialized(g, v) and not g.is_output[v] and g.buffer[v] >= 0]
        scratch = [(u.position, held_forward_scratch(g, u.index)) for u in g.units if held_forward_scratch(g, u.index)]
        out = []
        for t in range(self.num_stages):
            lo = self.bounds[t]
            held = {b for p, b in stored if p >= lo}
            extra = sum(tail_extra_bytes(g, b, planning=True) for b in held if g.position_of(b) >= lo)
            extra += sum(size for p, size in scratch if p >= lo)  # transposes' forward scratch, held
            held |= {g.buffer[v] for v in self.crossing[t]
                     if read_by_backward(g, v) and not g.is_output[v] and g.buffer[v] >= 0}
            out.append(sum(g.node_bytes[b] for b in held) + extra + max(self._stage_transient[0][t:]))
        return tuple(out)
