"""The CP-SAT model against brute force and against the independent simulator."""

import dataclasses
import itertools

import jax.numpy as jnp
import pytest

from remat_opt import InfeasibleBudgetError, Schedule
from remat_opt._graph import build_graph
from remat_opt._memory import simulate
from remat_opt._solve import SolverOptions, cut_candidates, min_peak_schedule, save_candidates, solve
from remat_opt._trace import trace


def _graph(fn, *args):
    return build_graph(trace(fn, args, {}, (0,)))


def tiny_chain(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x**2)


def tiny_skip(ws, x):
    h1 = jnp.tanh(x @ ws[0])
    h2 = jnp.sin(h1 @ ws[1])
    return jnp.sum((h2 + h1) ** 2)


def tiny_transpose(ws, x):
    h = jnp.tanh(x @ ws[0]).T + 1.0  # laid out transposed: a relayout copy when it crosses
    h2 = jnp.tanh(ws[1] @ h)
    return jnp.sum((h2 * h) ** 2)


PROGRAMS = {
    "chain": (tiny_chain, [jnp.full((8, 8), 0.1) for _ in range(3)], jnp.ones((16, 8))),
    "skip": (tiny_skip, [jnp.full((8, 8), 0.1) for _ in range(2)], jnp.ones((16, 8))),
    "transpose": (tiny_transpose, [jnp.full((8, 8), 0.1) for _ in range(2)], jnp.ones((16, 8))),
}


def _all_schedules(graph):
    cuts, saves = cut_candidates(graph, 64), save_candidates(graph)
    for k in range(len(cuts) + 1):
        for cut_set in itertools.combinations(cuts, k):
            for j in range(len(saves) + 1):
                for saved in itertools.combinations(saves, j):
                    yield Schedule(frozenset(cut_set), frozenset(saved))


@pytest.mark.parametrize("scale", [1.0, 1.3])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_solver_optimum_equals_brute_force(name, scale):
    fn, ws, x = PROGRAMS[name]
    graph = dataclasses.replace(_graph(fn, ws, x), plain_storage_scale=scale)  # as calibrated on XLA
    assert graph.num_positions <= 12
    sims = [simulate(graph, s) for s in _all_schedules(graph)]
    peaks = sorted({s.peak_bytes for s in sims})
    assert len(peaks) > 2, "the search space should offer several trade-offs"
    for budget in peaks[:: max(1, len(peaks) // 6)] + [peaks[-1]]:
        best = min(s.recompute_flops for s in sims if s.peak_bytes <= budget)
        solution = solve(graph, budget)
        checked = simulate(graph, solution.schedule)
        assert solution.status == "OPTIMAL"
        assert checked.peak_bytes <= budget
        assert checked.recompute_flops == solution.objective_flops == best


def test_min_peak_equals_brute_force():
    fn, ws, x = PROGRAMS["chain"]
    graph = _graph(fn, ws, x)
    lowest = min(simulate(graph, s).peak_bytes for s in _all_schedules(graph))
    assert simulate(graph, min_peak_schedule(graph)).peak_bytes == lowest


def test_infeasible_budget_reports_reachable_minimum():
    fn, ws, x = PROGRAMS["chain"]
    graph = _graph(fn, ws, x)
    lowest = simulate(graph, min_peak_schedule(graph)).peak_bytes
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, lowest - 1)
    assert info.value.min_budget_bytes == lowest
    assert "budget_bytes" in str(info.value)


def test_solve_is_deterministic():
    fn, ws, x = PROGRAMS["skip"]
    graph = _graph(fn, ws, x)
    budget = simulate(graph, min_peak_schedule(graph)).peak_bytes + 512
    options = SolverOptions(num_workers=4, seed=3)
    first, second = solve(graph, budget, options), solve(graph, budget, options)
    assert first.schedule == second.schedule
