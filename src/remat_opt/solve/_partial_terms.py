"""The gradient partials XLA sums at the end of the step, in CP-SAT's model.

:func:`remat_opt.memory._partials.held_partial_bytes` counts them for a
schedule; this module encodes the same count for one level of cuts (what
:class:`remat_opt.solve._encoding.Encoding` plans). For a summed weight of
``size`` bytes with readers at positions ``q_1 < ... < q_m`` (``n_i``
readers at ``q_i``):

* the last segment runs as written and leaves one partial per reader:
  ``n_i * tail(q_i)``;
* a fenced segment leaves one partial in all, counted at its first reader
  ``q_i``: ``g_i = (a cut in (q_{i-1}, q_i]) and not tail(q_i)``;
* while the fenced segment that ends at ``e`` runs its backward, the partials
  of every later segment are held, and its own readers' (a running count
  ``cnt[e]`` reset at each cut), less one, the gradient's own buffer:
  ``size * max(0, sum_{q_i > e} (n_i tail(q_i) + g_i) + cnt[e] - 1)``;
* the last segment holds ``size * max(0, cnt[n - 1] - 1)``; the end of the
  step, once every partial exists, ``size * max(0, sum_i (n_i tail(q_i) + g_i) - 1)``
  above the inputs and outputs.

The ``g_i`` and the running counts are bounded from below only: they only
raise a peak, so the solver sets them as low as the cuts allow, which is
their value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeAlias

from ortools.sat.python import cp_model

from ..program._graph import ProgramGraph, aval_bytes

Expr: TypeAlias = cp_model.LinearExpr | int
"""A CP-SAT linear expression, or a constant (a sum of no terms is ``0``)."""


class PartialTerms:
    """Per summed weight, the literals above; :meth:`at` gives an end's bytes."""

    def __init__(self, graph: ProgramGraph, model: cp_model.CpModel,
                 cut: dict[int, cp_model.IntVar], in_tail: Callable[[int], cp_model.IntVar | int],
                 ends: list[int]):
        self._model = model
        # Per summed weight: its bytes, its readers (position, count, tail, g), its running counts.
        self._weights: list[tuple[int, list[tuple[int, int, Expr, Expr]], dict[int, cp_model.IntVar]]] = []
        if not graph.summed_at_end:
            return
        invars = graph.traced.jaxpr.jaxpr.invars
        cut_list = sorted(cut)
        last = graph.num_positions - 1
        for k, summed in enumerate(graph.summed_at_end):
            if not summed:
                continue
            count = Counter(graph.units[u].position for u in graph.input_readers[k])
            # (position, readers there, tail literal or 1, g literal or 0)
            readers: list[tuple[int, int, Expr, Expr]] = []
            prev = -1
            for q in sorted(count):
                tail = in_tail(q)
                g: Expr = 0
                if not isinstance(tail, int):
                    g = model.new_bool_var(f"pg{k}_{q}")
                    starts: list[Expr] = [cut[c] for c in cut_list if prev < c <= q] if prev >= 0 else [1]
                    for s in starts:
                        model.add(g >= s - tail)
                readers.append((q, count[q], tail, g))
                prev = q
            self._weights.append((aval_bytes(invars[k].aval), readers,
                                  self._running_counts(k, count, cut, sorted({*ends, last}))))

    def _running_counts(self, k: int, count: Counter, cut: dict[int, cp_model.IntVar],
                        ends: list[int]) -> dict[int, cp_model.IntVar]:
        """Per end position, a count of the readers in the segment ending there
        (reset where a segment starts)."""
        m, total = self._model, sum(count.values())
        events = sorted({*count, *ends, *(c for c in cut if c <= ends[-1])})
        counts: dict[int, cp_model.IntVar] = {}
        prev = None
        for p in events:
            c = m.new_int_var(0, total, f"pc{k}_{p}")
            m.add(c >= count.get(p, 0))
            if prev is not None:
                m.add(c >= count.get(p, 0) + prev).only_enforce_if([~cut[p]] if p in cut else [])
            counts[p] = c
            prev = c
        return {e: counts[e] for e in ends}

    def at(self, e: int, last: bool) -> Expr:
        """Bytes of partials held while the segment ending at ``e`` runs its
        backward: a fenced one (a cut at ``e + 1``), or the last (``last``)."""
        total: Expr = 0
        for size, readers, counts in self._weights:
            later: Expr = 0 if last else sum(n * tail + g for q, n, tail, g in readers if q > e)
            total += self._positive(size, later + counts[e] - 1, 2 * sum(r[1] for r in readers))
        return total

    def at_end(self) -> Expr:
        """Bytes of partials held at the end of the step, above inputs and outputs."""
        return sum(self._positive(size, sum(n * tail + g for _, n, tail, g in readers) - 1,
                                  2 * sum(r[1] for r in readers))
                   for size, readers, _ in self._weights)

    def _positive(self, size: int, count: Expr, most: int) -> cp_model.IntVar:
        """``size * max(0, count)`` (from below), for a count below ``most``."""
        h = self._model.new_int_var(0, size * most, "ph")
        self._model.add(h >= size * count)
        return h

    def __bool__(self) -> bool:
        return bool(self._weights)
