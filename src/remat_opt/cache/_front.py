"""Each program's measured Pareto front: XLA's peak against recomputed FLOPs, for any budget.

A schedule XLA measured at one budget fits every larger budget of the same
program, but which schedules a search measures depends on its budget (the
model ranks candidates against it), so a search at a larger budget can miss
a plan a smaller one found and return a costlier one. Every schedule a search
measures is kept here, under the program's key at any budget
(:func:`remat_opt.cache._cache.plan_key` with no budget), as a point of the
program's front: its peak as XLA measured it and its recomputed FLOPs as a
plan counts them (on the traced gradient). A later search of the program is
answered by the front where it holds a cheaper point that fits
(:func:`cheapest`), so in one process, and across processes with the plan
cache on (an entry of kind ``front`` in its :data:`FOLDER`), a larger budget never costs more
recompute than a smaller one did.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

from ._cache import read_entry, versions, write_entry
from .._schedule import Schedule


class Point(NamedTuple):
    """One measured schedule: XLA's peak, its recomputed FLOPs (traced), the schedule."""

    peak: int
    flops: int
    schedule: Schedule


_fronts: dict[str, tuple[Point, ...]] = {}


def pareto(points: list[Point] | tuple[Point, ...]) -> tuple[Point, ...]:
    """The points no other beats: none lower in peak with as few FLOPs (lowest peak first;
    of equal points, the first)."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.peak, p.flops)):
        if not out or p.flops < out[-1].flops:
            out.append(p)
    return tuple(out)


FOLDER = "fronts"
"""The fronts' sub-folder of the plan cache: they are no plans (``cache list`` shows none);
``cache clear`` removes them with the plans."""


def _folder(directory: Path) -> Path:
    return directory / FOLDER


def front(key: str, directory: Path | None) -> tuple[Point, ...]:
    """The front kept for the program of ``key`` (this process's, joined with the plan
    cache's in ``directory`` the first time it is asked for)."""
    if key not in _fronts:
        _fronts[key] = ()
        entry = read_entry(_folder(directory), key) if directory is not None else None
        if entry is not None and entry["kind"] == "front":
            _fronts[key] = pareto([Point(int(p["peak"]), int(p["flops"]), Schedule.from_json(json.dumps(p["schedule"])))
                                   for p in entry["front"]])
    return _fronts[key]


def add(key: str, peak: int, flops: int, schedule: Schedule, directory: Path | None, function: str) -> None:
    """Adds a measured schedule to the front of ``key``; written to the plan cache's
    ``directory`` (unless ``None``) when it joins the front."""
    if schedule.plain:
        return
    before = front(key, directory)
    after = pareto([*before, Point(peak, flops, schedule)])
    _fronts[key] = after
    if directory is None or after == before:
        return
    write_entry(_folder(directory), key, {
        "versions": versions(), "kind": "front", "function": function,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "plan": {"measured_peak_bytes": after[0].peak}, "schedule": json.loads(after[0].schedule.to_json()),
        "loop_plan": None,
        "front": [{"peak": p.peak, "flops": p.flops, "schedule": json.loads(p.schedule.to_json())} for p in after]})


def cheapest(key: str, budget: int, directory: Path | None) -> Point | None:
    """The point of the front of ``key`` that fits ``budget`` with the fewest FLOPs, if any."""
    return min((p for p in front(key, directory) if p.peak <= budget), key=lambda p: p.flops, default=None)
