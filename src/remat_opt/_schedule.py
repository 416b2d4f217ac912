"""Schedules: the decisions a plan is made of, and the segments they cut.

A :class:`Schedule` says where segments start, which values are saved by
name, and which segments checkpoint their own recomputation again (nesting).
Every strategy (CP-SAT, Chen, Revolve, the built-in policies) produces one;
the memory model (:mod:`remat_opt.memory._simulate`) simulates it into a
:class:`Simulation`, and the rewriter (:mod:`remat_opt.rewrite._rewrite`) applies it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Decisions: where segments start, which values are saved by name, and
    which segments checkpoint their own recomputation again.

    Attributes:
        cuts: positions (primal equation indices) at which a new segment starts.
        saved: node ids saved by name (``name`` units only).
        plain: no remat at all; the program as the user wrote it.
        nested: segments whose backward recomputes them under a schedule of
            their own, as ``(first position of the segment, its schedule)``:
            the inner schedule's cuts lie strictly inside the segment, and
            its segments may nest again (Griewank's binomial checkpointing
            is such a tree). The last segment of any level runs as written.
            Inner schedules save nothing by name.
        bare: the segments are bare ``jax.checkpoint`` calls, without the fence that keeps a
            compiler from undoing them (:mod:`remat_opt.rewrite._rewrite`); for a backend whose
            compiler honours a bare checkpoint, when XLA measured the bare program within the
            budget.
    """

    cuts: frozenset[int] = frozenset()
    saved: frozenset[int] = frozenset()
    plain: bool = False
    nested: tuple[tuple[int, Schedule], ...] = ()
    bare: bool = False

    def all_cuts(self) -> frozenset[int]:
        """The cuts of every level: the segments every backward step runs on."""
        return self.cuts.union(*(inner.all_cuts() for _, inner in self.nested))

    def depth(self) -> int:
        """Levels of checkpointing: 1 without nesting."""
        return 1 + max((inner.depth() for _, inner in self.nested), default=0)

    def to_json(self) -> str:
        """The decisions as compact JSON, to store a plan beside its measurement
        (:meth:`from_json` reads it back; node ids and positions are those of
        the program graph traced from the same function and argument shapes)."""
        def tree(s: Schedule) -> dict:
            return {"cuts": sorted(s.cuts), "saved": sorted(s.saved), "plain": s.plain,
                    "nested": [[start, tree(inner)] for start, inner in s.nested]}
        # Written only when set: the JSON of every fenced schedule is what it was before the flag.
        return json.dumps(tree(self) | ({"bare": True} if self.bare else {}), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        """The schedule :meth:`to_json` wrote."""
        def tree(d: dict) -> Schedule:
            return cls(cuts=frozenset(d["cuts"]), saved=frozenset(d["saved"]), plain=d["plain"],
                       nested=tuple((start, tree(inner)) for start, inner in d["nested"]))
        d = json.loads(text)
        return dataclasses.replace(tree(d), bare=d.get("bare", False))


@dataclass(frozen=True)
class Simulation:
    """What the model predicts for a schedule."""

    peak_bytes: int
    recompute_flops: int
    recomputed_units: frozenset[int]
    stored_nodes: frozenset[int]
    segment_peaks: tuple[int, ...]
    segment_of_position: tuple[int, ...]


def segment_of_positions(num_positions: int, cuts: frozenset[int]) -> tuple[int, ...]:
    """Per position, the index of the segment it falls in (a cut starts a new one)."""
    seg, out = 0, []
    for p in range(num_positions):
        if p in cuts and p > 0:
            seg += 1
        out.append(seg)
    return tuple(out)


def nested_ranges(schedule: Schedule, num_positions: int) -> tuple[tuple[int, int], ...]:
    """The levels of ``schedule`` as position ranges ``[start, stop)``: the whole
    program first, then every nested segment, each before the segments nested in it.

    Raises:
        ValueError: a nested segment is not a segment of its level, is the last
            one (which runs as written and is never recomputed), has no cut of
            its own, or its schedule saves names.
    """
    out = [(0, num_positions)]

    def visit(level: Schedule, lo: int, hi: int) -> None:
        bounds = [lo, *sorted(c for c in level.cuts if lo < c < hi), hi]
        stop_of = dict(zip(bounds[:-1], bounds[1:]))
        for start, inner in sorted(level.nested, key=lambda item: item[0]):
            stop = stop_of.get(start)
            if stop is None or stop == hi:
                raise ValueError(f"nested segment at position {start} is not a segment of its level [{lo}, {hi}) "
                                 "other than the last (the last runs as written)")
            if inner.saved or inner.plain or not inner.cuts or any(not start < c < stop for c in inner.cuts):
                raise ValueError(f"the schedule nested at position {start} needs cuts strictly inside "
                                 f"[{start}, {stop}) and no saved names")
            out.append((start, stop))
            visit(inner, start, stop)

    visit(schedule, 0, num_positions)
    return tuple(out)
