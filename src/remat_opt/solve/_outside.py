"""Schedules outside CP-SAT's search, ranked for the planner to measure.

CP-SAT's model does not encode nested trees (:mod:`remat_opt.solve._nesting`),
and it may misjudge Chen's segmentations, bare and with every dot saved as a
fenced per-layer ``dots_saveable`` would (:mod:`remat_opt.solve._policy_saves`):
the model is conservative on heavily segmented plans, so CP-SAT can pass over
one that XLA fits. The planner measures some of them beside CP-SAT's plan;
here the model picks which, in tiers, their recomputation counted as a
measured plan's is, and XLA decides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from .._schedule import Schedule, Simulation
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ._baseline_picks import baseline_picks
from ._chen import chen_schedules
from ._keep_sets import keep_set_schedules
from ._nesting import nested_candidates
from ._policy_saves import policy_schedules

Tier = list[tuple[Schedule, Simulation]]

ScheduleSource = Callable[[ProgramGraph], Sequence[Schedule]]
"""A strategy outside CP-SAT: the schedules it offers for a program graph, at any budget."""

SOURCES: tuple[ScheduleSource, ...] = (nested_candidates, chen_schedules, policy_schedules, keep_set_schedules)
"""What :func:`outside_tiers` ranks, in this order (of schedules the model runs alike, the first
is kept): nested trees, Chen's segmentations, the same with the dots saved, keep-sets."""


def outside_tiers(graph: ProgramGraph, budget: int, ceiling_flops: int | None, slack: float,
                  per_tier: int, traced_flops: Callable[[Schedule], int] | None = None) -> list[Tier]:
    """The schedules worth measuring, with the model's simulation of each, in tiers.

    First those the model puts within ``slack`` of ``budget`` (a share of it)
    and under the program as written (the model is calibrated on XLA's figure
    for it, so a schedule at or above it is predicted to save nothing), with
    fewer recomputed FLOPs than ``ceiling_flops``, the cheapest first. Where
    ``traced_flops`` is given (a schedule's recomputed FLOPs counted on the
    traced gradient, as a measured plan's are), the ``per_tier`` the model
    puts cheapest are counted that way, and that count
    decides against the ceiling and the order: the model prices recomputation
    by the units it reruns, while JAX's partial evaluation of a checkpointed
    segment can change the gradient's FLOPs either way. Counted that way, the
    schedules the Chen and Revolve baselines measure join them wherever the
    model puts them: measured cheapest first up to the first that fits, no
    baseline that fits recomputes less than the plan. Then,
    when nothing fits yet (no ceiling), those the model puts lowest, and every
    schedule the Chen and Revolve baselines measure
    (:func:`remat_opt.solve._baseline_picks.baseline_picks`): where the model
    under-predicts some schedules, it ranks them below one XLA fits, and a
    budget a baseline fits is not to be refused. At most ``per_tier`` each
    (the baselines' picks besides), and in the first one more where the
    ``per_tier`` cheapest are all predicted over the budget: the cheapest
    predicted under it. Ties broken by cuts, so the order is deterministic.
    Schedules the model runs alike (the same units recomputed, the same
    values stored, the same peak: Chen's segmentation, and the same
    with dots saved only where the last segment keeps them anyway) are
    measured once, so that one compile is not spent twice on one program.
    """
    # What the Chen and Revolve baselines measure: worked out only where a tier takes them.
    picks = functools.cache(lambda: baseline_picks(graph))
    schedules = {s: None for source in SOURCES for s in source(graph)}
    sims, behaviours = [], set()
    for s in schedules:  # one of each behaviour: the first (fewest names) of those the model runs alike
        sim = simulate(graph, s)
        behaviour = (sim.recomputed_units, sim.stored_nodes, sim.peak_bytes, sim.recompute_flops)
        if behaviour not in behaviours:
            behaviours.add(behaviour)
            sims.append((s, sim))

    def key(t: tuple[Schedule, Simulation]) -> tuple:
        return t[1].recompute_flops, sorted(t[0].all_cuts())

    saving = simulate(graph, Schedule(plain=True)).peak_bytes
    within = sorted((t for t in sims if t[1].peak_bytes <= budget * (1 + slack) and t[1].peak_bytes < saving),
                    key=key)
    if traced_flops is None:
        below = [t for t in within if ceiling_flops is None or t[1].recompute_flops < ceiling_flops]
        cheapest = _with_cheapest_fit(below, per_tier, budget)
    else:  # with the baselines' picks, whatever the model says of them: no baseline that fits is cheaper
        head = _with_cheapest_fit(within, per_tier, budget)
        added = [(s, simulate(graph, s)) for s in picks() if s not in {h for h, _ in head}]
        cheapest = _by_traced_flops([*head, *added], traced_flops, ceiling_flops)
    tiers = [cheapest]
    if ceiling_flops is None:
        lowest = [t for t in sorted(sims, key=lambda t: (t[1].peak_bytes, *key(t))) if t not in cheapest][:per_tier]
        # And what the baselines measure: a budget one of them fits is never refused.
        seen = {s for s, _ in (*cheapest, *lowest)}
        tiers.append([*lowest, *((s, simulate(graph, s)) for s in picks() if s not in seen)])
    return tiers


def _with_cheapest_fit(tier: Tier, per_tier: int, budget: int) -> Tier:
    """The first ``per_tier`` of ``tier``, and after them the first the model puts
    at or under ``budget``, if it is not among them: schedules the slack lets in
    (predicted over the budget) never crowd out the cheapest one predicted to fit."""
    head = tier[:per_tier]
    fit = next((t for t in tier if t[1].peak_bytes <= budget), None)
    return head if fit is None or fit in head else [*head, fit]


def _by_traced_flops(tier: Tier, traced_flops: Callable[[Schedule], int], ceiling_flops: int | None) -> Tier:
    """The schedules of ``tier`` whose traced FLOPs are under ``ceiling_flops``, the fewest first."""
    counted = [(traced_flops(s), sorted(s.all_cuts()), (s, sim)) for s, sim in tier]
    return [t for flops, _, t in sorted(counted, key=lambda c: c[:2])
            if ceiling_flops is None or flops < ceiling_flops]
