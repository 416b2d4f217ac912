"""The schedules outside CP-SAT's search that the planner measures (solve/_outside.py)."""

import jax.numpy as jnp
import pytest

from remat_opt._schedule import Schedule
from remat_opt.memory import model_graph
from remat_opt.memory._simulate import simulate
from remat_opt.program._trace import trace
from remat_opt.solve._chen import chen_schedules
from remat_opt.solve._nesting import nested_candidates
from remat_opt.solve._outside import outside_tiers, reach
from remat_opt.solve._policy_saves import policy_schedules


def head_on_a_chain(ws, head, x):
    for w in ws:  # elementwise layers, then one matrix product: a classifier's head
        x = jnp.tanh(x * w)
    return jnp.sum((x @ head) ** 2)


def _behaviour(graph, schedule):
    sim = simulate(graph, schedule)
    return sim.recomputed_units, sim.stored_nodes, sim.peak_bytes, sim.recompute_flops


def test_schedules_the_model_runs_alike_are_measured_once():
    # Chen's segmentation with the dots saved where the last segment keeps them
    # anyway runs as the bare segmentation does: one compile for both.
    args = ([jnp.full((16,), 0.1) for _ in range(9)], jnp.full((16, 4), 0.1), jnp.ones((32, 16)))
    graph = model_graph(trace(head_on_a_chain, args, {}, (0, 1)))
    chen = chen_schedules(graph)
    every = {s: None for s in (*nested_candidates(graph), *chen, *policy_schedules(graph, chen))}
    behaviours = {_behaviour(graph, s) for s in every}
    assert len(behaviours) < len(every)  # the program offers twins
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    tiers = outside_tiers(graph, 10 * plain, None, 0.15, len(every))
    ranked = [s for tier in tiers for s, _ in tier]
    assert len({_behaviour(graph, s) for s, _ in tiers[0]}) == len(tiers[0])
    # Every behaviour below the plain peak is still offered, by its schedule with the fewest names.
    below = {_behaviour(graph, s) for s in every if simulate(graph, s).peak_bytes < plain}
    assert {_behaviour(graph, s) for s, _ in tiers[0]} == below
    for s, _ in tiers[0]:
        twins = [t for t in every if _behaviour(graph, t) == _behaviour(graph, s)]
        assert len(s.saved) == min(len(t.saved) for t in twins)
    assert len(ranked) == len(set(ranked))


def test_the_reach_follows_the_models_errors_on_this_program():
    budget = 1000
    assert reach([], budget, 0.15, 0.02) == 0.15  # nothing measured yet: the widest the model has been seen off
    assert reach([30, -10], budget, 0.15, 0.02) == pytest.approx(0.05)  # the largest over-prediction, a margin
    assert reach([-40], budget, 0.15, 0.02) == pytest.approx(0.02)  # under-predicted: the margin alone
    assert reach([500], budget, 0.15, 0.02) == 0.15  # never wider than the slack


def test_a_candidate_out_of_reach_is_not_offered():
    args = ([jnp.full((16,), 0.1) for _ in range(9)], jnp.full((16, 4), 0.1), jnp.ones((32, 16)))
    graph = model_graph(trace(head_on_a_chain, args, {}, (0, 1)))
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    lowest = min(sim.peak_bytes for _, sim in outside_tiers(graph, plain, None, 0.15, 10**3)[0])
    budget = int(lowest / 1.04)  # every candidate is predicted 4% over, or more
    wide = [s for s, _ in outside_tiers(graph, budget, 10**12, 0.15, 50)[0]]
    narrow = [s for s, _ in outside_tiers(graph, budget, 10**12, reach([0], budget, 0.15, 0.02), 50)[0]]
    assert wide and not narrow
