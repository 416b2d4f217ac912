"""CP-SAT's search steered by XLA's figures (remat_opt.planner._steering), with XLA played by a rule.

Each test stands XLA in with a known error of the model (XLA's figure = the
model's prediction times a factor), so that what the steering must do is
known: tighten the target after an overshoot, loosen it after an
over-prediction, fall back to the lowest-memory schedules, and stop at a
ceiling. No compile runs; the model and CP-SAT are the real ones.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from remat_opt import InfeasibleBudgetError, Schedule
from remat_opt.planner._steering import Steering, steered_plan
from remat_opt.memory import model_graph
from remat_opt.memory import simulate
from remat_opt.program import trace
from remat_opt.solve import SolverClock, SolverOptions, min_peak_schedule, solve

OPTIONS = SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=1)


@dataclasses.dataclass(frozen=True)
class Planned:
    """What the steering reads of a plan."""

    schedule: Schedule
    measured_peak_bytes: int
    measured_recompute_flops: int
    status: str
    solve_seconds: float = 0.0
    attempts: int = 0


def chain(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x**2)


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.normal(size=(64, 64)).astype(np.float32) / 8) for _ in range(16)]
    x = jnp.asarray(rng.normal(size=(1024, 64)).astype(np.float32))  # reaches half the plain peak
    return model_graph(trace(chain, (ws, x), {}, (0,)))


def steering(graph, factor: float, measured: list) -> Steering:
    """XLA as a rule: each schedule's peak is the model's times ``factor``; ``measured``
    collects every figure given."""

    def measure(schedule):
        measured.append(round(simulate(graph, schedule).peak_bytes * factor))
        return measured[-1]

    def finish(sim, schedule, program, outcome):
        return Planned(schedule, outcome.peak, sim.recompute_flops, outcome.status, outcome.seconds,
                       outcome.attempts), program

    def infeasible(schedule, peak):
        return InfeasibleBudgetError(0, peak, schedule=schedule)

    return Steering(OPTIONS, max_attempts=4, relax_slack=0.02, retry_margin=100, fallback_candidates=4,
                    model_slack=0.15, program=lambda schedule: schedule, measure=measure, finish=finish,
                    infeasible=infeasible)


def budget_at(graph, share: float) -> int:
    return int(share * simulate(graph, Schedule(plain=True)).peak_bytes)


def test_an_overshoot_tightens_the_target_until_xla_fits(graph):
    budget = budget_at(graph, 0.75)
    first = solve(graph, budget, OPTIONS).schedule
    assert simulate(graph, first).peak_bytes * 1.1 > budget  # the model's own plan: XLA puts it over
    measured: list[int] = []
    plan, program = steered_plan(graph, budget, None, SolverClock(), steering(graph, 1.1, measured))
    assert plan.measured_peak_bytes <= budget and program == plan.schedule
    assert measured[0] > budget and len(measured) >= 2
    # CP-SAT's own plan, not the lowest-memory fallback's: the model predicted the first plan
    # so far under the target that the tightened one admitted it again, and the target then
    # went under its prediction.
    assert plan.status == "OPTIMAL" and len(measured) < plan.attempts
    lowest = simulate(graph, min_peak_schedule(graph, OPTIONS))
    assert plan.measured_recompute_flops < lowest.recompute_flops


def test_an_over_prediction_loosens_the_target_to_a_cheaper_plan(graph):
    budget = budget_at(graph, 0.75)
    first = solve(graph, budget, OPTIONS).schedule
    plan, _ = steered_plan(graph, budget, None, SolverClock(), steering(graph, 0.8, []))
    assert plan.measured_peak_bytes <= budget
    assert plan.measured_recompute_flops < simulate(graph, first).recompute_flops


def test_with_nothing_under_budget_the_error_names_the_least_xla_measured(graph):
    budget = budget_at(graph, 0.75)
    measured: list[int] = []
    with pytest.raises(InfeasibleBudgetError) as err:
        steered_plan(graph, budget, None, SolverClock(), steering(graph, 4.0, measured))
    lowest = simulate(graph, min_peak_schedule(graph, OPTIONS)).peak_bytes
    assert err.value.min_budget_bytes == min(measured) == round(4.0 * lowest)  # the least XLA measured


def test_a_plan_that_fits_already_stops_a_search_that_only_costs_more(graph):
    budget = budget_at(graph, 0.75)
    measured: list[int] = []
    assert steered_plan(graph, budget, 1, SolverClock(), steering(graph, 1.0, measured)) is None
    assert measured == []  # nothing compiled: CP-SAT's plan recomputes no less than the ceiling


def test_the_same_graph_and_budget_give_the_same_plan(graph):
    budget = budget_at(graph, 0.7)
    plans = [steered_plan(graph, budget, None, SolverClock(), steering(graph, 1.1, []))[0] for _ in range(2)]
    assert dataclasses.replace(plans[0], solve_seconds=0) == dataclasses.replace(plans[1], solve_seconds=0)


def test_a_re_solve_starts_from_the_plan_in_hand(graph, monkeypatch):
    """After a plan XLA fits, every later solve starts from it (a loosened target
    admits it), so none returns a costlier schedule than the one in hand."""
    import remat_opt.planner._steering as steering_module

    calls = []

    def recorded(graph, target, options, starts=()):
        solution = solve(graph, target, options, starts)
        calls.append((tuple(starts), solution))
        return solution

    monkeypatch.setattr(steering_module, "solve", recorded)
    budget = budget_at(graph, 0.75)
    plan, _ = steered_plan(graph, budget, None, SolverClock(), steering(graph, 0.8, []))
    assert len(calls) >= 2 and calls[0][0] == ()
    first = calls[0][1]  # XLA (0.8 of the model) fits it: the target loosens
    assert calls[1][0] == (first.schedule,)
    assert all(later.objective_flops <= first.objective_flops for _, later in calls[1:])
