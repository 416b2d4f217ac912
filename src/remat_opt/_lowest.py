"""The lowest-memory schedule XLA measured for each program, kept for the process.

:class:`remat_opt.InfeasibleBudgetError` names the lowest peak measured for
any plan, and says a budget at or above it works. Which schedules a search
measures depends on its budget, though: the model ranks candidates against
the budget, so a schedule measured at one budget (where it was the lowest)
may not be among those measured at a higher one. A program the model
misjudges (a convolutional network it put 39% under XLA's figure) was
refused again at the very budget its error had named.

So the schedule behind an error is kept here, under the program's key for
any budget (:func:`remat_opt._cache.plan_key` with no budget), and a later
search of the same program that finds nothing under its budget measures it
before giving up (its figures are kept by :mod:`remat_opt.memory._compiles`,
so that costs no compile). A fresh process plans from scratch.
"""

from __future__ import annotations

from ._schedule import Schedule

_lowest: dict[str, tuple[int, Schedule]] = {}


def remember(key: str, measured: int, schedule: Schedule) -> None:
    """Keeps ``schedule`` for the program of ``key`` if XLA measured it lower than any kept."""
    if key not in _lowest or measured < _lowest[key][0]:
        _lowest[key] = (measured, schedule)


def recall(key: str, budget: int) -> Schedule | None:
    """The schedule kept for the program of ``key``, if it measured within ``budget``."""
    measured, schedule = _lowest.get(key, (None, None))
    return schedule if measured is not None and measured <= budget else None
