"""Optimal where the answer is known: remat_opt against hand-written keep-set plans on XLA.

The hand-written plans (``known_programs``: a fenced segment per matmul, a subset
of the matmuls' outputs kept, the rest recomputed) are measured on XLA, and
remat_opt is asked for a budget equal to one's peak: it must fit, give
``jax.grad``'s gradients, and recompute no more than the plan (1% slack).
The closed forms say which plan that is; the generated programs enumerate
them all. The full sweep is ``experiments/known.py``.
"""

from __future__ import annotations

import pytest

import remat_opt
from known_programs import (Dot, KeepSet, KnownProgram, answers, best_fitting, chain, draw, draw_branches,
                            enumerate_keep_sets, graph_of, keep_set_schedule, monotone, pareto_budgets)
from remat_opt.cache import _front
from remat_opt.memory import gradient_flops
from remat_opt.memory import simulate
from remat_opt.rewrite import apply_schedule
from remat_opt.solve import keep_set_schedules, measured_keep_set


def measured(program, kept_sets) -> list[KeepSet]:
    """The keep-set plans ``kept_sets`` of ``program``, measured (peak, traced recompute)."""
    params, x = program.args()
    graph = graph_of(program)
    base = gradient_flops(program, (params, x), {}, 0)
    out = []
    for kept in kept_sets:
        fn = apply_schedule(program, graph, keep_set_schedule(graph, kept, program.interleaved))
        out.append(KeepSet(kept, remat_opt.peak_bytes(fn, params, x),
                           gradient_flops(fn, (params, x), {}, 0) - base, 0.0))
    return out


def dot_flops(program, i: int) -> int:
    d = program.dots[i]
    return 2 * program.batch * d.k * d.w


def check(program, plans: list[KeepSet]) -> None:
    """remat_opt at each plan's peak (below the plain peak), ascending: fits, exact
    gradients, no more recompute than the plan, monotone in the budget. (The model's
    prediction is not held to 10% here: see experiments/known.py's figures.)"""
    params, x = program.args()
    plain = remat_opt.peak_bytes(program, params, x)
    plans = sorted((p for p in plans if p.peak < plain), key=lambda p: p.peak)
    assert plans, "no hand-written plan lowers the peak: the case tests nothing"
    found = answers(program, plans, [p.peak for p in plans])
    for ans in found:
        assert ans.fits, ans
        assert ans.grad_error < 1e-4, ans
        assert ans.no_worse, ans
    assert monotone(found), found


def test_even_chain_saving_k_of_n_recomputes_n_minus_k():
    program = chain((4,) * 6, ks=(4,) * 6, name="even")
    plans = measured(program, [tuple(range(k)) for k in range(3)])  # more than 2 kept peaks above plain
    d = dot_flops(program, 0)
    for p in plans:  # the closed form: each matmul not kept is recomputed once
        assert round(p.flops / d) == 6 - len(p.kept), p
    check(program, plans[::2])


def test_equal_ratio_uneven_chain_is_a_knapsack():
    # Every matmul reads 4 units: FLOPs per byte kept are equal, so recompute is the bytes not kept.
    program = chain((5, 1, 3, 2), ks=(4, 4, 4, 4), name="knapsack")
    plans = measured(program, [(), (2,), (1, 3)])  # 0, 3 and 3 units kept
    unit = dot_flops(program, 1)  # the 1-unit matmul
    for p in plans:
        assert round(p.flops / unit) == 11 - sum(program.dots[i].w // 8 for i in p.kept), p
    check(program, [plans[0], plans[2]])


def test_of_two_equal_outputs_the_cheaper_is_recomputed():
    # Matmuls 2 and 3 write 4 units each; matmul 2 reads 4 units, matmul 3 a slice of 2.
    program = chain((4,) * 6, ks=(4, 4, 4, 2, 4, 4), name="cheaper")
    expensive, cheap = measured(program, [(2,), (3,)])
    assert expensive.flops < cheap.flops  # keeping the expensive one recomputes less
    check(program, [expensive])


def test_parallel_branches_keep_the_costliest_output_that_fits():
    # Three branches of x: two write 4 units, reading 8 and 2; one writes 2, reading 8.
    program = KnownProgram((Dot((-1,), 64, 32), Dot((-1,), 16, 32), Dot((-1,), 64, 16)), x_width=64,
                           name="branches", interleaved=True)
    expensive, cheap = measured(program, [(0,), (1,)])
    assert expensive.flops < cheap.flops
    check(program, [expensive])


@pytest.mark.parametrize("seed", [1])  # a 3-matmul DAG of DEV_SEEDS with two budgets under its plain peak
def test_generated_program_no_worse_than_every_keep_set(seed):
    program = draw(seed)
    keep_sets = enumerate_keep_sets(program)
    params, x = program.args()
    budgets = pareto_budgets(keep_sets, remat_opt.peak_bytes(program, params, x))
    check(program, [best_fitting(keep_sets, b) for b in budgets])


def test_keep_sets_are_candidates():
    """Every hand-written keep-set is among the schedules the planner ranks and measures."""
    program = chain((5, 1, 3, 2), ks=(4, 4, 4, 4))
    graph = graph_of(program)
    candidates = set(keep_set_schedules(graph))
    assert {keep_set_schedule(graph, kept) for kept in [(), (0,), (1, 3), (0, 1, 2, 3)]} <= candidates


def test_front_answers_every_budget_it_covers(tmp_path):
    a, b, c = (remat_opt.Schedule(cuts=frozenset({i})) for i in (1, 2, 3))
    _front.add("k", 100, 50, a, tmp_path, "f")
    _front.add("k", 120, 10, b, tmp_path, "f")
    _front.add("k", 130, 20, c, tmp_path, "f")  # beaten by b: not on the front
    assert [p.schedule for p in _front.front("k", tmp_path)] == [a, b]
    assert _front.cheapest("k", 99, tmp_path) is None
    assert _front.cheapest("k", 125, tmp_path).schedule == b
    _front._fronts.clear()  # a later process: read back from the plan cache
    assert [(p.peak, p.flops, p.schedule) for p in _front.front("k", tmp_path)] == [(100, 50, a), (120, 10, b)]
    assert _front.front("k", None) == _front.front("k", tmp_path)
    assert not list(tmp_path.glob("*.json"))  # no plan entry: `cache list` shows plans only
    from remat_opt.cache import clear
    clear(tmp_path)
    _front._fronts.clear()
    assert _front.front("k", tmp_path) == ()


def test_the_sweep_reads_its_committed_results():
    """experiments/known.py's figures, read back from the CSVs it wrote (no compile)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    csvs = sorted((root / "experiments" / "results").glob("known_*.csv"))
    assert csvs
    run = subprocess.run([sys.executable, str(root / "experiments" / "known.py"), "--summary", *map(str, csvs)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    import re

    assert run.stdout.startswith("all: ")
    assert all(float(e) < 1e-4 for e in re.findall(r"largest gradient error ([0-9.e+-]+),", run.stdout))


def test_measured_keep_set_descends_when_keeping_nothing_is_over_the_budget():
    """XLA's peak is not monotone in the kept set: where every segmentation keeping nothing
    is over the budget, keeping an output can bring it under, and the search finds that."""
    program = chain((4, 4, 4), ks=(4, 4, 4))
    graph = graph_of(program)
    first, second, third = sorted(keep_set_schedules(graph)[-1].saved)  # the three matmul outputs, in order

    def measure(schedule: remat_opt.Schedule) -> int:  # keeping the first output lowers the peak; the rest raise it
        kept = set(schedule.saved)
        return 1000 - 100 * (first in kept) + 60 * len(kept - {first})

    found = measured_keep_set(graph, 950, measure)
    assert found is not None
    assert found == (remat_opt.Schedule(cuts=found[0].cuts, saved=frozenset({first})), 900)
    assert measured_keep_set(graph, 850, measure) is None  # and nothing else fits under what it measured


def test_before_a_refusal_every_keep_set_is_measured():
    """Where the greedy and its second look find nothing that fits and nothing else fits either,
    the other keep-sets of a small program are measured before a refusal (``exhaustive``)."""
    program = chain((4,) * 5, ks=(4,) * 5)  # 32 keep-sets: more than the looks reach
    graph = graph_of(program)
    *_, second, third = sorted(keep_set_schedules(graph)[-1].saved)

    def measure(schedule: remat_opt.Schedule) -> int:  # only keeping the last two outputs fits
        return 900 if schedule.saved == {second, third} else 1000

    assert measured_keep_set(graph, 950, measure) is None
    found = measured_keep_set(graph, 950, measure, exhaustive=True)
    assert found is not None and found[0].saved == {second, third} and found[1] == 900


def test_an_evaluation_seed_that_drove_a_change_is_development_and_replaced():
    from known_programs import EVAL_SEEDS, FRESH_MOVED_TO_DEV, FRESH_SEEDS, MOVED_TO_DEV, seeds_of

    for family, moved in MOVED_TO_DEV.items():
        held_out, dev = seeds_of(family, True), seeds_of(family, False)
        assert len(held_out) == len(EVAL_SEEDS) and not set(moved) & set(held_out) and set(moved) <= set(dev)
    for family, moved in FRESH_MOVED_TO_DEV.items():
        fresh, dev = seeds_of(family, False, fresh=True), seeds_of(family, False)
        assert len(fresh) == len(FRESH_SEEDS) and not set(moved) & set(fresh) and set(moved) <= set(dev)


def test_the_second_look_measures_each_keep_set_once_across_segmentations():
    """Segmentations that differ only by where an elementwise equation falls mostly measure alike:
    a keep-set is looked at on one of them before any twin, and the looks reach the cheapest one
    that fits."""
    program = chain((4, 4, 4, 4), ks=(1, 2, 3, 4))
    graph = graph_of(program)
    names = sorted(keep_set_schedules(graph)[-1].saved)
    target = frozenset(names[:3])  # past the keep-sets that recompute less than it, and their twins
    budget = min(simulate(graph, s).peak_bytes for s in keep_set_schedules(graph) if s.saved == target)
    calls: list[remat_opt.Schedule] = []

    def measure(schedule: remat_opt.Schedule) -> int:
        """The model's peak, exact; but of the keep-sets only the target fits."""
        calls.append(schedule)
        peak = simulate(graph, schedule).peak_bytes
        return peak if schedule.saved in (frozenset(), target) else max(peak, budget + 1)

    found = measured_keep_set(graph, budget, measure)
    assert found is not None and found[0].saved == target and found[1] <= budget
    kept = [s.saved for s in calls if s.saved]
    assert len(kept) == len(set(kept))  # each keep-set measured once


def test_the_looks_left_go_to_keep_sets_the_model_rules_out():
    """Where the model over-predicts a cheaper keep-set by more than any it measured, the looks
    the likely keep-sets leave are spent on it, the cheapest first."""
    program = chain((4, 4, 4), ks=(4, 4, 4))
    graph = graph_of(program)
    names = sorted(keep_set_schedules(graph)[-1].saved)
    target = frozenset(names[:2])
    lowest = min(keep_set_schedules(graph), key=lambda s: (s.saved != frozenset(), simulate(graph, s).peak_bytes))
    budget = simulate(graph, lowest).peak_bytes  # keeping nothing fits, as the model says

    def measure(schedule: remat_opt.Schedule) -> int:
        """The model's peak, exact, but for the target, which XLA fits where the model says it does not."""
        return budget if schedule.saved == target else simulate(graph, schedule).peak_bytes

    assert all(simulate(graph, s).peak_bytes > budget * 1.05 for s in keep_set_schedules(graph) if s.saved == target)
    found = measured_keep_set(graph, budget, measure)
    assert found is not None and found[0].saved == target


def test_a_keep_set_xla_fits_on_one_twin_segmentation_and_not_another_is_found():
    """Twins can measure apart (fresh seed 20059: a keep-set 20% over the budget on one, exactly
    at it on the other): once every keep-set has had its look, the looks left go to twins."""
    program = chain((4, 4, 4), ks=(4, 4, 4))
    graph = graph_of(program)
    names = sorted(keep_set_schedules(graph)[-1].saved)
    target = frozenset(names[:2])
    budget = max(simulate(graph, s).peak_bytes for s in keep_set_schedules(graph) if not s.saved)
    calls: list[remat_opt.Schedule] = []

    def measure(schedule: remat_opt.Schedule) -> int:
        """Keeping nothing fits on every segmentation; of the keep-sets, only the target, and
        not on the first segmentation it is measured on."""
        calls.append(schedule)
        if not schedule.saved:
            return simulate(graph, schedule).peak_bytes
        first = next(s for s in calls if s.saved == target) if schedule.saved == target else None
        return budget if first is not None and schedule != first else budget + 1

    found = measured_keep_set(graph, budget, measure)
    twice = [s for s in calls if s.saved == target]
    assert found is not None and found[0].saved == target and found[1] <= budget
    assert len(twice) >= 2 and found[0] != twice[0]


def test_a_keep_sets_first_look_goes_to_the_twin_the_model_errs_less_on():
    """Twin segmentations (a keep-set recomputes as much on each) can measure apart: where the
    keep-sets measured on one of them came out over the model's peaks, a keep-set's first look
    goes to its twin, and finds the fit there (the structure of fresh seed 20088, session 48)."""
    graph = graph_of(draw_branches(20088))
    schedules = keep_set_schedules(graph)
    dots = sorted(schedules[-1].saved)
    # The segmentations in the search's order when keeping nothing measures as the model says.
    greedy, twin, *_ = sorted({s.cuts for s in schedules},
                              key=lambda c: (simulate(graph, remat_opt.Schedule(cuts=c)).peak_bytes, sorted(c)))
    target = frozenset(dots[2:])
    on = [simulate(graph, remat_opt.Schedule(cuts=c, saved=target)) for c in (greedy, twin)]
    assert len({(s.peak_bytes, s.recompute_flops) for s in on}) == 1  # the model tells the twins apart in nothing
    budget = on[1].peak_bytes
    calls: list[remat_opt.Schedule] = []

    def measure(schedule: remat_opt.Schedule) -> int:
        """The model's peak keeping nothing; on ``greedy``, keeping anything 50 kB over it; elsewhere
        only the target fits."""
        calls.append(schedule)
        peak = simulate(graph, schedule).peak_bytes
        if not schedule.saved:
            return peak
        if schedule.cuts == greedy:
            return peak + 50_000
        return peak if schedule.saved == target else max(peak, budget + 1)

    found = measured_keep_set(graph, budget, measure)
    assert found == (remat_opt.Schedule(cuts=twin, saved=target), budget)
    assert remat_opt.Schedule(cuts=greedy, saved=target) not in calls
