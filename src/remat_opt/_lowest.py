"""The lowest-memory schedule XLA measured for each program, kept.

:class:`remat_opt.InfeasibleBudgetError` names the lowest peak measured for
any plan, and says a budget at or above it works. Which schedules a search
measures depends on its budget, though: the model ranks candidates against
the budget, so a schedule measured at one budget (where it was the lowest)
may not be among those measured at a higher one. A program the model
misjudges (a convolutional network it put 39% under XLA's figure) was
refused again at the very budget its error had named.

So the schedule behind an error is kept, under the program's key for any
budget (:func:`remat_opt._cache.plan_key` with no budget): for the rest of
the process, and in the plan cache (an entry of kind ``"lowest"``) when it is
on. A later search of the same program that finds nothing under its budget
measures it before giving up (in the same process its figures are kept by
:mod:`remat_opt.memory._compiles`, so that costs no compile).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ._cache import entry_schedule, read_entry, versions, write_entry
from ._schedule import Schedule

_lowest: dict[str, tuple[int, Schedule]] = {}


def remember(key: str, measured: int, schedule: Schedule, directory: Path | None, function: str) -> None:
    """Keeps ``schedule`` for the program of ``key`` if XLA measured it lower than any kept
    (and in the plan cache's ``directory``, unless ``None``); ``function`` names the program there."""
    if key in _lowest and _lowest[key][0] <= measured:
        return
    _lowest[key] = (measured, schedule)
    if directory is not None:
        entry = {"versions": versions(), "kind": "lowest", "function": function,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "plan": {"measured_peak_bytes": measured},
                 "schedule": json.loads(schedule.to_json()), "loop_plan": None}
        write_entry(directory, key, entry)


def recall(key: str, budget: int, directory: Path | None) -> Schedule | None:
    """The schedule kept for the program of ``key`` (in this process, else in the plan
    cache's ``directory``), if XLA measured it within ``budget``."""
    if key not in _lowest and directory is not None:
        entry = read_entry(directory, key)
        if entry is not None and entry["kind"] == "lowest":
            _lowest[key] = (int(entry["plan"]["measured_peak_bytes"]), entry_schedule(entry))
    measured, schedule = _lowest.get(key, (None, None))
    return schedule if measured is not None and measured <= budget else None
