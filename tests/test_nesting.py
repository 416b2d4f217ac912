"""Nested schedules: Revolve's count, exact gradients and FLOPs, and plans below the flat minimum."""

import functools
from math import comb

import jax
import numpy as np
import pytest

import remat_opt
from remat_opt import Schedule
from remat_opt.memory import model_graph
from remat_opt.memory import gradient_flops
from remat_opt.memory import calibrate
from remat_opt.memory import simulate
from remat_opt.solve._nesting import MAX_DEPTH, chain_trees, nested_candidates, revolve_schedule
from remat_opt.rewrite import apply_schedule
from remat_opt._schedule import nested_ranges
from remat_opt.program import trace
from remat_opt.zoo import MODELS, MLPConfig

CONFIG = MLPConfig(depth=24, width=128, batch=512)
"""A chain deep enough for trees three levels deep and a nested plan below every flat one;
experiments/deep_chain.py makes the same comparisons at 32 layers (its default)."""
# Two workers as on a CI machine's two cores; the same options for both solves below.
FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=2.0, num_workers=2)


def griewank_recomputations(steps: int, snapshots: int) -> int:
    """Forward steps Revolve recomputes to reverse ``steps`` equal steps
    (Griewank & Walther 2000): ``t·L − C(s + t, t − 1)`` with the fewest
    repetitions ``t`` such that ``C(s + t, s) >= L``."""
    if steps == 1:
        return 0
    t = 1
    while comb(snapshots + t, snapshots) < steps:
        t += 1
    return t * steps - comb(snapshots + t, t - 1)


@pytest.mark.parametrize("snapshots", [1, 2, 3, 5])
def test_revolve_recursion_meets_griewanks_count(snapshots):
    for steps in range(1, 40):
        cost, tree = chain_trees(tuple(range(steps + 1)), tape=False, max_depth=steps + 1)(snapshots)
        assert cost == griewank_recomputations(steps, snapshots), (steps, snapshots)
        assert tree is not None and tree.all_cuts() <= set(range(1, steps))


def test_taping_more_steps_is_never_dearer():
    """``m`` units with multi-step tapes include every Revolve tree with ``m − 1`` states."""
    rng = np.random.default_rng(0)
    prefix = tuple(np.concatenate([[0], np.cumsum(rng.integers(1, 9, size=20))]).tolist())
    for depth in (2, 3):
        tape, revolve = chain_trees(prefix, True, depth), chain_trees(prefix, False, depth)
        costs = [tape(m)[0] for m in range(1, 22)]
        assert costs == sorted(costs, reverse=True) and costs[-1] == 0
        for m in range(2, 22):
            assert tape(m)[0] <= revolve(m - 1)[0]


def _recursive_trees(prefix, tape, max_depth):
    """The dynamic program written as the recursion it solves, scanning cuts upwards:
    the reference for the tabled one (the same totals, the same first cut on a tie)."""
    inf = float("inf")

    @functools.cache
    def cost(i, j, m, depth):
        limit = m if tape else 1
        if j - i <= limit:
            return 0.0, 0
        if m < 2 - (not tape):
            return inf, 0
        best = (inf, 0)
        for k in range(i + 1, j):
            rest = cost(k, j, m - 1, depth)[0]
            first = cost(i, k, m, depth - 1)[0] if depth > 1 else (0.0 if k - i <= limit else inf)
            total = rest + (prefix[k] - prefix[i]) + first
            if total < best[0]:
                best = (total, k)
        return best

    def cuts(i, j, m, depth):
        out = []
        while j - i > (m if tape else 1):
            k = cost(i, j, m, depth)[1]
            out.append((i, k, cuts(i, k, m, depth - 1) if depth > 1 else ()))
            i, m = k, m - 1
        return tuple(out)

    def tree(m):
        total = cost(0, len(prefix) - 1, m, max_depth)[0]
        return total, (None if total == inf else cuts(0, len(prefix) - 1, m, max_depth))

    return tree


def _tree_cuts(schedule, start=0):
    """A tree as :func:`_recursive_trees` writes it: each level's segments before its
    last, in order, each with its nested cuts."""
    points, nested = sorted(schedule.cuts), dict(schedule.nested)
    return tuple((a, k, _tree_cuts(nested[a], a) if a in nested else ())
                 for a, k in zip([start, *points[:-1]], points))


@pytest.mark.parametrize("tape", [False, True])
def test_the_tabled_program_equals_the_recursion(tape):
    """Equal steps (every cut ties), random ones, and FLOPs past float precision's 2**53."""
    rng = np.random.default_rng(1)
    chains = [[5] * 12, rng.integers(1, 9, size=14).tolist(), rng.choice([0, 1, 10**12, 3 * 10**15], size=10).tolist()]
    for steps in chains:
        prefix = tuple(int(x) for x in np.concatenate([[0], np.cumsum(steps, dtype=object)]))
        for depth in (1, 2, 3):
            tabled, recursive = chain_trees(prefix, tape, depth), _recursive_trees(prefix, tape, depth)
            for m in range(len(prefix) + 1):
                cost, tree = tabled(m)
                want_cost, want_cuts = recursive(m)
                assert cost == want_cost, (steps, depth, m)
                assert (tree is None) == (want_cuts is None), (steps, depth, m)
                if tree is not None:
                    assert _tree_cuts(tree) == want_cuts, (steps, depth, m)


def test_depth_limit_is_kept():
    prefix = tuple(range(31))
    for depth in (2, 3):
        _, tree = chain_trees(prefix, False, depth)(8)  # C(8 + 2, 2) >= 30 steps
        assert tree is not None and tree.depth() <= depth
    # Flat, 6 states tape 7 steps at most (one each); 30 steps need a second level.
    assert chain_trees(prefix, False, 1)(6) == (float("inf"), None)
    assert chain_trees(tuple(range(8)), False, 1)(6)[1].depth() == 1


def test_malformed_nesting_is_refused():
    with pytest.raises(ValueError, match="last"):
        nested_ranges(Schedule(cuts=frozenset({4}), nested=((4, Schedule(cuts=frozenset({6}))),)), 8)
    with pytest.raises(ValueError, match="strictly inside"):
        nested_ranges(Schedule(cuts=frozenset({4}), nested=((0, Schedule(cuts=frozenset({5}))),)), 8)
    assert nested_ranges(Schedule(cuts=frozenset({4}), nested=((0, Schedule(cuts=frozenset({2}))),)), 8) == (
        (0, 8), (0, 4))


@pytest.fixture(scope="module")
def mlp():
    spec = MODELS["mlp"]
    params, batch = spec.init(CONFIG, jax.random.PRNGKey(0))
    plain = remat_opt.peak_bytes(spec.loss, params, batch)
    graph = calibrate(model_graph(trace(spec.loss, (params, batch), {}, (0,))), plain)
    return spec.loss, params, batch, graph


def test_nested_programs_are_exact_and_counted(mlp):
    """Checkpoints within checkpoints: the same gradients, and the FLOPs the model counts."""
    loss, params, batch, graph = mlp
    expected = jax.grad(loss)(params, batch)
    plain_flops = gradient_flops(loss, (params, batch), {}, 0)
    trees = [s for s in (revolve_schedule(graph, k) for k in (2, 4)) if s is not None]
    trees.append(min(nested_candidates(graph), key=lambda s: simulate(graph, s).peak_bytes))
    assert max(s.depth() for s in trees) >= 3
    for schedule in trees:
        program = apply_schedule(loss, graph, schedule)
        got = jax.grad(program)(params, batch)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        extra = gradient_flops(program, (params, batch), {}, 0) - plain_flops
        sim = simulate(graph, schedule)
        assert abs(sim.recompute_flops - extra) <= 0.01 * plain_flops
        measured = remat_opt.peak_bytes(program, params, batch)
        # The model is one or two activations short on nested trees: the bound is the one the
        # 32-layer chain needed (docs/measurements.md).
        assert abs(sim.peak_bytes - measured) <= 0.08 * measured, (schedule.depth(), sim.peak_bytes, measured)


def test_nesting_reaches_below_every_flat_plan(mlp):
    """remat_opt's lowest peak with nesting is under Chen's and CP-SAT's flat minimum,
    and a budget there is met by a nested plan with exact gradients."""
    loss, params, batch, graph = mlp
    greedy = remat_opt.chen_greedy(remat_opt.BaselineCall(loss, (params, batch), budget_bytes=1),
                                   measure_top=3)
    with pytest.raises(remat_opt.InfeasibleBudgetError) as info:
        remat_opt.optimize(loss, 1, solver_options=FAST).plan(params, batch)
    assert info.value.lower_bound  # one byte: under the step's arguments and outputs; the search runs there
    floor = info.value.min_budget_bytes
    with pytest.raises(remat_opt.InfeasibleBudgetError) as info:
        remat_opt.optimize(loss, floor, solver_options=FAST).plan(params, batch)
    lowest = info.value.min_budget_bytes
    assert lowest < greedy.measured_peak_bytes
    step = remat_opt.optimize(loss, lowest, solver_options=FAST)
    plan = step.plan(params, batch)
    assert plan.fits and plan.schedule.depth() > 1, str(plan)
    assert plan.measured_peak_bytes <= lowest
    assert abs(plan.recompute_flops - plan.measured_recompute_flops) <= 0.01 * plan.baseline_flops
    got, want = jax.grad(step)(params, batch), jax.grad(loss)(params, batch)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    revolve = remat_opt.revolve(remat_opt.BaselineCall(loss, (params, batch), budget_bytes=lowest))
    assert revolve.schedule.depth() <= MAX_DEPTH
    if revolve.fits:  # wherever Revolve fits, remat_opt fits with no more recompute
        assert plan.measured_recompute_flops <= revolve.measured_recompute_flops
