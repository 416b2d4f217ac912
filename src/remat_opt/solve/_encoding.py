"""The CP-SAT model of the memory model: variables, constraints, objective terms.

It encodes :func:`remat_opt.memory._simulate.simulate` with ``planning=True``
linearly (read that module first; the tests hold the two equal, and equal to
brute force on small graphs):

* ``cut[c]``: a segment starts at candidate position ``c``.
* ``save[v]``: name node ``v`` is saved by the forward.
* ``cross[v, k]``: some cut lies between ``v`` and its ``k``-th later reader,
  so ``v`` is stored from that reader's position on (monotone in ``k``).
* ``rc[u]``: unit ``u`` is recomputed in its segment's backward. Residuals
  that are not stored force ``rc``; a recomputed unit forces its inputs.
* ``tail[c]``: no cut at or after candidate ``c``, so what follows lies in
  the last segment, which runs as written: its residuals are stored (with
  the calibrated extra) and count only at the program's end.
* Running sums with a reset at every cut give each segment's recomputed
  bytes, relayout copies and largest transient; at each possible segment
  end the peak of the segment is bounded by the budget.
* Gradient partials XLA sums at the end of the step add to each segment's
  peak and to the end's (:mod:`remat_opt.solve._partial_terms`).

The objective is the recomputed FLOPs. Unlike Checkmate's MILP (one boolean
per stage and node, O(n²)), the variables here are O(nodes + cuts), because
the execution model fixes the order: forward, then segments in reverse.

References:
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
    Rematerialization", MLSys 2020; Bartan et al., "Moccasin: Efficient Tensor
    Rematerialization for Neural Networks", ICML 2023.
"""

from __future__ import annotations

import bisect

from ortools.sat.python import cp_model

from ..program._graph import ProgramGraph
from ..memory._fusion import materialized, read_by_backward
from ..memory._terms import boundary_cotangent_bytes, kept_buffers, remat_bytes, tail_extra_bytes
from ..memory._transient import held_forward_scratch, transient_bytes
from .._schedule import Schedule
from ._partial_terms import Expr, PartialTerms
from ..memory._slots import gradient_slots, slot_candidates, slot_reads


def cut_candidates(graph: ProgramGraph, limit: int, include: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """Positions where a segment may start.

    Half of ``limit`` are the positions with the fewest crossing bytes; the
    other half, the narrowest position of each of ``limit / 2`` equal windows
    of the program, so that every part of a long program (every layer of an
    unrolled scan) can be cut. ``include`` (a starting schedule's cuts) is
    added, so that the start is a solution of the model.
    """
    n = graph.num_positions
    positions = range(1, n)
    if n - 1 <= limit:
        return tuple(positions)
    key = lambda c: (graph.crossing_bytes(c), c)  # noqa: E731
    chosen = set(sorted(positions, key=key)[: limit - limit // 2])
    windows = max(1, limit // 2)
    for w in range(windows):
        lo, hi = 1 + w * (n - 1) // windows, 1 + (w + 1) * (n - 1) // windows
        if lo < hi:
            chosen.add(min(range(lo, hi), key=key))
    return tuple(sorted(chosen | {c for c in include if 0 < c < n}))


def save_candidates(graph: ProgramGraph) -> tuple[int, ...]:
    """Name nodes worth saving: the backward reads them or recomputes from them."""
    out = []
    for v in range(graph.num_nodes):
        unit = graph.units[graph.node_unit[v]]
        if unit.name is None or graph.is_output[v]:
            continue
        if graph.residual[v] or any(graph.units[u].name is None for u in graph.consumers[v]):
            out.append(v)
    return tuple(out)


class Encoding:
    """The CP-SAT model of one graph over fixed candidate sets."""

    def __init__(self, graph: ProgramGraph, cuts: tuple[int, ...], saves: tuple[int, ...]):
        self.graph = graph
        self._fenced_reads: dict[tuple[int, int], cp_model.IntVar] = {}
        m = self.model = cp_model.CpModel()
        self.cut = {c: m.new_bool_var(f"cut{c}") for c in cuts}
        self.save = {v: m.new_bool_var(f"save{v}") for v in saves}
        self._cut_list = sorted(self.cut)
        self.cross = self._crossings()
        self.tail = self._tails()
        self.rc = self._recomputed()
        # Schedules that save a name lose two of the planning model's terms
        # (memory._simulate.simulate with planning=True).
        self.any_saved = None
        if self.save:
            self.any_saved = m.new_bool_var("any_saved")
            m.add_max_equality(self.any_saved, list(self.save.values()))
        self.own_output = self._own_outputs()
        self.acc, self.tmax = self._running_sums()
        # Gradient slots, and the buffers that may sit in them (_slots.slot_credit).
        slots = gradient_slots(graph)
        self.slot_candidates = slot_candidates(graph, slots)
        self.slot_reads = slot_reads(slots)
        self.ends = self._segment_ends()
        self.flops = sum(self.rc[u] * graph.units[u].flops for u in graph.primal)

    def _cuts_between(self, lo: int, hi: int) -> list[cp_model.IntVar]:
        """Cut literals at positions in (lo, hi]."""
        return [self.cut[c] for c in self._cut_list if lo < c <= hi]

    def _crossings(self) -> dict[int, list[tuple[int, cp_model.IntVar]]]:
        """Per value, ``(reader position, literal)`` in increasing position: the literal
        is 1 when a cut lies between the value and that reader (or an earlier one)."""
        g, m = self.graph, self.model
        cross: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
        for v in range(g.num_nodes):
            if g.is_output[v]:
                continue
            p = g.position_of(v)
            readers = sorted({g.units[u].position for u in g.consumers[v] if g.units[u].position > p})
            chain: list[tuple[int, cp_model.IntVar]] = []
            prev, prev_pos = None, p
            for q in readers:
                new = self._cuts_between(prev_pos, q)
                if not new and prev is None:
                    prev_pos = q
                    continue
                lit = m.new_bool_var(f"x{v}_{q}")
                parts = new + ([prev] if prev is not None else [])
                m.add_max_equality(lit, parts)
                chain.append((q, lit))
                prev, prev_pos = lit, q
            if chain:
                cross[v] = chain
        for v, s in self.save.items():
            if v in cross:
                m.add(s + cross[v][-1][1] <= 1)  # saving a value that is stored anyway only costs
        return cross

    def _tails(self) -> dict[int, cp_model.IntVar]:
        """Per cut candidate ``c``, a literal that is 1 when no segment starts at or after
        ``c``: position ``c - 1`` onwards lies in the last segment, which runs as written."""
        m = self.model
        tail: dict[int, cp_model.IntVar] = {}
        later = None
        for c in reversed(self._cut_list):
            t = m.new_bool_var(f"tail{c}")
            parts = [self.cut[c]] + ([~later] if later is not None else [])
            m.add_bool_or(parts).only_enforce_if(~t)  # not tail => a cut at or after c
            m.add_implication(t, ~self.cut[c])
            if later is not None:
                m.add_implication(t, later)
            tail[c] = t
            later = t
        return tail

    def in_tail(self, p: int) -> cp_model.IntVar | int:
        """1 when position ``p`` lies in the last segment (a literal, or the constant 1)."""
        nxt = next((c for c in self._cut_list if c > p), None)
        return 1 if nxt is None else self.tail[nxt]

    def _available(self, v: int) -> list[cp_model.IntVar | int]:
        """The literals under which a residual ``v`` is at hand in the backward: stored
        across a cut, saved by name, or computed in the last segment."""
        g = self.graph
        found = [x for x in (self.cross[v][-1][1] if v in self.cross else None, self.save.get(v)) if x is not None]
        return found + ([self.in_tail(g.position_of(v))] if g.residual[v] else [])

    def _recomputed(self) -> dict[int, cp_model.IntVar]:
        """Per unit, a literal that is 1 when its segment's backward recomputes it: every
        residual not at hand, and every input of a recomputed unit not at hand."""
        g, m = self.graph, self.model
        rc = {u.index: m.new_bool_var(f"rc{u.index}") for u in g.units}
        for v in range(g.num_nodes):
            if g.residual[v]:
                m.add(rc[g.node_unit[v]] + sum(self._available(v)) >= 1)
        for u in g.units:
            for w in u.inputs:
                m.add(rc[g.node_unit[w]] + sum(self._available(w)) >= rc[u.index])
        return rc

    def _own_outputs(self) -> dict[int, cp_model.IntVar]:
        """A segment output read only by the last segment is saved by name for its own
        segment when that segment's recomputation reads it (memory._simulate.simulate)."""
        g, m = self.graph, self.model
        own: dict[int, cp_model.IntVar] = {}
        for v, chain in self.cross.items():
            if read_by_backward(g, v):
                continue
            fenced = [f for f in (self._crosses_before_tail(v, q, lit) for q, lit in chain) if f is not None]
            kept = m.new_bool_var(f"own{v}")
            for u in set(g.consumers[v]):
                m.add(kept >= self.rc[u] + chain[-1][1] - 1 - sum(fenced))
            own[v] = kept
        return own

    def _running_sums(self) -> tuple[list[cp_model.IntVar], list[cp_model.IntVar]]:
        """Per position, the bytes its segment's backward has rematerialized (and copied
        into another layout) so far, and its largest transient so far: running sums
        and maxima over positions, reset where a segment starts."""
        g, m = self.graph, self.model
        no_names = [~self.any_saved] if self.any_saved is not None else []
        by_pos: list[list[int]] = [[] for _ in range(g.num_positions)]
        for unit in g.units:
            by_pos[unit.position].append(unit.index)
        relayout = self._relayout_terms()
        big = 2 * sum(g.node_bytes) + 1
        kept = kept_buffers(g)
        accs: list[cp_model.IntVar] = []
        tmaxes: list[cp_model.IntVar] = []
        for p in range(g.num_positions):
            local = sum(self.rc[u] * remat_bytes(g, u, kept) for u in by_pos[p]) + sum(relayout[p])
            t_here = max((transient_bytes(g, u) for u in by_pos[p]), default=0)
            acc = m.new_int_var(0, big, f"acc{p}")
            tmax = m.new_int_var(0, big, f"tmax{p}")
            m.add(acc >= local)
            m.add(tmax >= t_here)
            last_here = self.in_tail(p)  # behind a fence unless in the last segment
            for u in by_pos[p]:
                recomputed_here = transient_bytes(g, u, recomputed=True)
                if recomputed_here > t_here:
                    m.add(tmax >= recomputed_here).only_enforce_if([self.rc[u], *no_names])
                fenced_bytes = transient_bytes(g, u, fenced=True)  # a transpose's forward scratch
                if fenced_bytes > t_here and not isinstance(last_here, int):
                    m.add(tmax >= fenced_bytes).only_enforce_if(~last_here)
            if p > 0:
                enforce = [~self.cut[p]] if p in self.cut else []
                m.add(acc >= accs[p - 1] + local).only_enforce_if(enforce)
                m.add(tmax >= tmaxes[p - 1]).only_enforce_if(enforce)
            accs.append(acc)
            tmaxes.append(tmax)
        return accs, tmaxes

    def _segment_ends(self) -> list[tuple[int, Expr, list[cp_model.IntVar]]]:
        """The peak at each segment's end, ``(position, expression, enforced when)``: at
        ``c - 1`` for each cut candidate ``c`` (when it is cut), at the program's end,
        and, with gradient partials summed at the end, the step's end."""
        g = self.graph
        n = g.num_positions
        out: list[tuple[int, Expr, list[cp_model.IntVar]]] = []
        base = g.input_bytes + g.output_bytes
        ends = [c - 1 for c in self._cut_list] + [n - 1]
        partials = PartialTerms(g, self.model, self.cut, self.in_tail, ends)  # gradient partials summed at the end
        for e in ends:
            stored = self._stored_at(e)
            expr = base + stored + self.acc[e] + self.tmax[e] + boundary_cotangent_bytes(g, e + 1)
            if partials:
                expr += partials.at(e, last=e == n - 1)
            enforce = [self.cut[e + 1]] if e + 1 in self.cut else []
            out.append((e, expr, enforce))
        if partials:
            out.append((n - 1, base + partials.at_end(), []))
        return out

    def _relayout_terms(self) -> list[list[Expr]]:
        """Per position, the relayout copies its segment's backward makes
        (:func:`remat_opt.memory._terms.relayout_bytes`, spread over reading positions)."""
        g = self.graph
        terms: list[list[Expr]] = [[] for _ in range(g.num_positions)]
        if not g.transposed:
            return terms
        for v in range(g.num_nodes):
            if not g.transposed[v] or g.is_output[v]:
                continue
            if v in self.save:
                terms[g.position_of(v)].append(g.node_bytes[v] * self.save[v])
            for q, lit in self.cross.get(v, ()):
                read = self._crosses_before_tail(v, q, lit)  # v crosses into q's segment, not the last
                if read is not None:
                    terms[q].append(g.node_bytes[v] * read)
        return terms

    def _crosses_before_tail(self, v: int, q: int, lit: cp_model.IntVar) -> cp_model.IntVar | None:
        """A literal for: ``v`` crosses a cut before its reader at ``q``, and ``q``
        is not in the last segment; ``None`` when ``q`` is always in it."""
        tail = self.in_tail(q)
        if isinstance(tail, int):
            return None
        if (v, q) not in self._fenced_reads:
            both = self.model.new_bool_var(f"fenced{v}_{q}")
            self.model.add_bool_and([lit, ~tail]).only_enforce_if(both)
            self.model.add_bool_or([~lit, tail, both])
            self._fenced_reads[v, q] = both
        return self._fenced_reads[v, q]

    def _stored_at(self, e: int) -> Expr:
        """Bytes of distinct stored buffers live at the end position ``e``.

        At the program's end that includes the last segment's own residuals."""
        g = self.graph
        live: dict[int, list[cp_model.IntVar]] = {}  # buffer -> literals: some value laid over it is live
        total = self._tail_stored(live) if e == g.num_positions - 1 else 0
        crossing = self._crossing_live(e, live)
        for v, s in self.save.items():
            if g.position_of(v) <= e:
                live.setdefault(g.buffer[v], []).append(s)
        for v, kept in self.own_output.items():
            if g.position_of(v) <= e:
                live.setdefault(g.buffer[v], []).append(kept)
        for b, lits in live.items():
            if b < 0:
                continue
            if len(lits) == 1:
                lit = lits[0]
            else:
                lit = self.model.new_bool_var(f"buf{b}_{e}")
                self.model.add_max_equality(lit, lits)
            total += g.node_bytes[b] * lit
        return total - self._slot_credit(e, crossing)

    def _tail_stored(self, live: dict[int, list[cp_model.IntVar]]) -> Expr:
        """At the program's end, the last segment's residuals and held sources, added to
        ``live``; returns the calibrated extra of code run as written and its
        transposes' forward scratch."""
        g = self.graph
        tail_buffers = set()
        for v in range(g.num_nodes):
            if materialized(g, v) and not g.is_output[v]:  # residuals and held sources
                lit = self.in_tail(g.position_of(v))
                if isinstance(lit, int):
                    lit = self.model.new_constant(1)
                live.setdefault(g.buffer[v], []).append(lit)
                tail_buffers.add(g.buffer[v])
        total: Expr = 0
        for b in sorted(tail_buffers - {-1}):  # calibrated storage of code run as written
            total += tail_extra_bytes(g, b, planning=True) * self.in_tail(g.position_of(b))
        for u in g.units:  # and its transposes' forward scratch
            if held_forward_scratch(g, u.index):
                total += held_forward_scratch(g, u.index) * self.in_tail(u.position)
        return total

    def _crossing_live(self, e: int, live: dict[int, list[cp_model.IntVar]]) -> dict[int, list[cp_model.IntVar]]:
        """Values stored across a cut and live at ``e``, added to ``live``; returns
        them per buffer (what may sit in a gradient slot)."""
        g = self.graph
        crossing: dict[int, list[cp_model.IntVar]] = {}
        for v, chain in self.cross.items():
            lits = [lit for q, lit in chain if q <= e]
            if not lits:
                continue
            if e == g.num_positions - 1 and not read_by_backward(g, v):
                # Into the last segment, which runs as written, a value the
                # backward does not read dies in the forward: it is live at the
                # end only if it crosses into a reader in a fenced segment.
                fenced = [self._crosses_before_tail(v, q, lit) for q, lit in chain]
                lits = [lit for lit in fenced if lit is not None]
                if not lits:
                    continue
                lit = self.model.new_bool_var(f"kept{v}")
                self.model.add_max_equality(lit, lits)
                lits = [lit]
            live.setdefault(g.buffer[v], []).append(lits[-1])
            crossing.setdefault(g.buffer[v], []).append(lits[-1])
        return crossing

    def _slot_credit(self, e: int, crossing: dict[int, list[cp_model.IntVar]]) -> Expr:
        """Stored bytes laid over free gradient slots at the end position ``e``
        (:func:`remat_opt.memory._slots.slot_credit`).

        ``y`` marks a buffer credited: stored across a cut, in a schedule that
        saves no names.
        A buffer fits the slots of its size whose input's last reader precedes
        it; those sets are nested, so Hall's condition on each prefix (no more
        buffers up to a position than slots free before it) makes the largest
        credit equal the simulator's matching.
        """
        g, m = self.graph, self.model
        items: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
        for b, position in self.slot_candidates.items():
            if b in crossing:
                y = m.new_bool_var(f"slot{b}_{e}")
                m.add(y <= sum(crossing[b]))
                if self.any_saved is not None:
                    m.add_implication(y, ~self.any_saved)
                items.setdefault(g.node_bytes[b], []).append((position, y))
        credit: Expr = 0
        for size, listed in items.items():
            reads = self.slot_reads[size]
            listed.sort(key=lambda item: item[0])
            for k, (position, _) in enumerate(listed):
                if k + 1 == len(listed) or listed[k + 1][0] != position:
                    m.add(sum(y for _, y in listed[: k + 1]) <= bisect.bisect_left(reads, position))
            credit += size * sum(y for _, y in listed)
        return credit

    def schedule(self, solver: cp_model.CpSolver) -> Schedule:
        cuts = frozenset(c for c, x in self.cut.items() if solver.value(x))
        saved = frozenset(v for v, x in self.save.items() if solver.value(x))
        return Schedule(cuts=cuts, saved=saved)
