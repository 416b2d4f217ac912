"""The error when no plan fits: the lowest peak XLA measured in the search, said once.

Every strategy of a search (loop plans, whole-function policies, schedules outside CP-SAT,
CP-SAT's lowest-memory schedules) measured some peak; the error names the lowest, the same
whatever ran before in the process, and keeps the lowest measured schedules for a later call
(:mod:`remat_opt.cache._lowest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..cache._cache import cache_directory, qualified_name
from .._errors import InfeasibleBudgetError
from ..cache._lowest import lowest_kept, remember
from .._plan import measured_peak_of
from ._search_state import Search


def nothing_fits(run: Search, fn: Callable[..., Any]) -> InfeasibleBudgetError:
    """The error when nothing fits: it names the lowest peak XLA measured for any plan
    of this search (loop plans, whole-function policies, outside schedules, CP-SAT's
    lowest-memory schedules), the same whatever ran before; a lower peak an earlier plan
    of this program measured is said beside it. The lowest measured schedules are kept
    for a later call (:mod:`remat_opt.cache._lowest`)."""
    lowest_key, budget = run.model.key, run.call.budget
    loops, tried, lowest_other = run.attempts.loops, run.attempts.measured_policies, run.attempts.lowest_other
    # CP-SAT's search refuses whenever nothing fits it; a ceiling ends it only once something has.
    infeasible = run.attempts.infeasible or InfeasibleBudgetError(budget, run.plain_peak)
    directory, name = cache_directory(run.call.options.cache), qualified_name(fn)
    earlier = lowest_kept(lowest_key, directory)  # what earlier plans of this program measured
    if infeasible.schedule is not None:
        remember(lowest_key, infeasible.min_budget_bytes, infeasible.schedule, directory, name)
    lowest = [(c.measured, f"{c.loop}") for c in loops]
    lowest += [(c.measured, f"jax.checkpoint(fn, policy={c.policy})") for c in tried]
    if lowest_other is not None and lowest_other[0].schedule is not None:  # a measured schedule
        remember(lowest_key, measured_peak_of(lowest_other[0]), lowest_other[0].schedule, directory, name)
        depth = lowest_other[0].schedule.depth()
        lowest.append((measured_peak_of(lowest_other[0]),
                       f"a nested schedule ({depth} levels)" if depth > 1 else "a Chen segmentation"))
    peak, what = min(lowest, default=(infeasible.min_budget_bytes, ""))
    # What earlier plans measured is said, not named as the figure: that stays this search's own.
    note = "" if earlier is None or earlier[0] >= min(peak, infeasible.min_budget_bytes) else (
        f" An earlier plan of this program measured {earlier[0]:,} bytes; that budget is planned too.")
    if peak < infeasible.min_budget_bytes:
        # One minimum, not two: the solver's own lowest is said here, not chained as a second error.
        return InfeasibleBudgetError(budget, peak, detail=f"(XLA measured {peak:,} bytes for the lowest-memory "
                                     f"plan: {what}; CP-SAT's lowest-memory schedule, "
                                     f"{infeasible.min_budget_bytes:,}.){note}")
    if note:
        return InfeasibleBudgetError(budget, infeasible.min_budget_bytes, detail=infeasible.detail + note,
                                     schedule=infeasible.schedule)
    return infeasible
