"""The schedules Chen's and Revolve's baselines measure, defined once.

A baseline that ranks candidates by the model measures the few it puts
lowest and keeps the lowest XLA measures. The planner promises that no baseline
that fits recomputes less than its plan, and never to refuse a budget one fits,
so it measures the same schedules wherever the model puts them
(:func:`remat_opt.solve._outside.outside_tiers`); the baselines
(:mod:`remat_opt.baselines._baselines`) pick theirs here too, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._schedule import Schedule
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ._chen import chen_greedy_candidates, chen_sqrt_n_schedule
from ._nesting import revolve_schedules

MEASURE_TOP = 3
"""How many of their candidates the ranking baselines measure, by default."""


def lowest_predicted(graph: ProgramGraph, schedules: Iterable[Schedule], top: int) -> tuple[Schedule, ...]:
    """The ``top`` of ``schedules`` the model predicts lowest; ties keep the order given."""
    return tuple(sorted(schedules, key=lambda s: simulate(graph, s).peak_bytes)[:top])


def greedy_picks(graph: ProgramGraph, top: int = MEASURE_TOP) -> tuple[Schedule, ...]:
    """The Chen greedy candidates the baseline measures: the lowest predicted, fewer cuts first on a tie."""
    candidates = sorted((s for _, s in chen_greedy_candidates(graph)), key=lambda s: len(s.cuts))
    return lowest_predicted(graph, candidates, top)


def baseline_picks(graph: ProgramGraph, top: int = MEASURE_TOP) -> tuple[Schedule, ...]:
    """Every schedule the Chen sqrt(n), Chen greedy and Revolve baselines measure at their defaults."""
    picks = (chen_sqrt_n_schedule(graph), *greedy_picks(graph, top),
             *lowest_predicted(graph, revolve_schedules(graph), top))
    return tuple(dict.fromkeys(picks))
