"""Schedules' and policies' FLOPs, counted once per program for the process.

The planner counts a schedule's FLOPs on its traced gradient step
(:func:`remat_opt.memory._measure.gradient_flops`), as it counts a measured
plan's, and tracing a rewritten step costs about as much as compiling it.
It counts the same schedules at every budget: what the Chen and Revolve
baselines measure (:mod:`remat_opt.solve._baseline_picks`) and Chen's
segmentations do not depend on the budget, nor do JAX's built-in policies
around the whole function. A sweep of budgets over one program (the demo, a
Pareto front) traced them again at each.

The count is a function of the program and the schedule (or policy), so it is kept
under the program's key for any budget (:func:`remat_opt.cache._cache.plan_key`
with no budget: the program's text and the options the rewrite and the
cost model read), as :mod:`remat_opt.cache._lowest` keeps its lowest schedule.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from .._kept import kept

KEPT = 4096
"""Counts kept, the least recently used dropped first (each is one number)."""

_counts: OrderedDict[tuple[str, Hashable], int] = OrderedDict()


def counted_flops(key: str | None, what: Hashable, count: Callable[[], int]) -> int:
    """``count()``, the gradient step's FLOPs of the program of ``key`` under
    ``what`` (a :class:`remat_opt._schedule.Schedule`, or a policy's name), run
    only the first time this process asks; afterwards, the count kept. With no
    ``key`` (a cost model the key cannot name), counted every time."""
    return count() if key is None else kept(_counts, (key, what), count, KEPT)


def forget() -> None:
    """Drops every count kept (for tests)."""
    _counts.clear()
