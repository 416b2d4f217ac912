"""The lowest-memory schedule XLA measured for each program, kept.

:class:`remat_opt.InfeasibleBudgetError` names the lowest peak measured for
any plan, and says a budget at or above it works. Which schedules a search
measures depends on its budget, though: the model ranks candidates against
the budget, so a schedule measured at one budget (where it was the lowest)
may not be among those measured at a higher one. A program the model
misjudges (a convolutional network it put far under XLA's figure:
docs/xla_findings.md, section 8) was refused again at the very budget its
error had named.

So the lowest-memory schedule XLA measured is kept, under the program's key
for any budget (:func:`remat_opt.cache._cache.plan_key` with no budget): the one
behind an error, and any schedule a plan returned, for the rest of the
process; in the plan cache (an entry of kind ``"lowest"``) when an error names
it and the cache is on. A later search of the same program that finds nothing
under its budget measures it before giving up (in the same process its
figures are kept by :mod:`remat_opt.memory._compiles`, so that costs no
compile); if XLA fits it, that is the plan. If not, the error still names its
own search's lowest peak (the same for the same program and budget, whatever
ran before) and says the lower one beside it: a user sweeping budgets
downwards learns that a plan measured at a higher budget is within reach.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ._cache import entry_schedule, read_entry, versions, write_entry
from .._schedule import Schedule

_lowest: dict[str, tuple[int, Schedule]] = {}


def remember(key: str, measured: int, schedule: Schedule, directory: Path | None, function: str) -> None:
    """Keeps ``schedule`` for the program of ``key`` if XLA measured it lower than any kept,
    and the lowest kept in the plan cache's ``directory`` (unless ``None``) if that holds none
    as low; ``function`` names the program there."""
    if key not in _lowest or measured < _lowest[key][0]:
        _lowest[key] = (measured, schedule)
    if directory is None:
        return
    measured, schedule = _lowest[key]
    entry = read_entry(directory, key)
    if entry is not None and entry["kind"] == "lowest" and int(entry["plan"]["measured_peak_bytes"]) <= measured:
        return
    write_entry(directory, key, {"versions": versions(), "kind": "lowest", "function": function,
                                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                 "plan": {"measured_peak_bytes": measured},
                                 "schedule": json.loads(schedule.to_json()), "loop_plan": None})


def lowest_kept(key: str, directory: Path | None) -> tuple[int, Schedule] | None:
    """XLA's peak and the schedule kept for the program of ``key`` (in this process, else in
    the plan cache's ``directory``), whatever the budget; ``None`` if none is."""
    if key not in _lowest and directory is not None:
        entry = read_entry(directory, key)
        if entry is not None and entry["kind"] == "lowest":
            _lowest[key] = (int(entry["plan"]["measured_peak_bytes"]), entry_schedule(entry))
    return _lowest.get(key)


def recall(key: str, budget: int, directory: Path | None) -> Schedule | None:
    """The schedule kept for the program of ``key`` (:func:`lowest_kept`), if XLA measured it
    within ``budget``."""
    kept = lowest_kept(key, directory)
    return kept[1] if kept is not None and kept[0] <= budget else None
