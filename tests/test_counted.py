"""A schedule's FLOPs are counted once per program, for every budget a process plans (_counted)."""

import jax.numpy as jnp
import pytest

import remat_opt
from remat_opt.cache import _counted
from remat_opt.planner import _flop_search, _policy_planning
from remat_opt.rewrite import POLICIES


def mlp(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


@pytest.fixture
def traced(monkeypatch):
    """The rewritten programs whose gradient FLOPs the planner counts, from a clean slate of counts."""
    programs = []
    count = _flop_search.gradient_flops

    def counting(fn, *args, **kwargs):
        if fn is not mlp:
            programs.append(fn)
        return count(fn, *args, **kwargs)

    _counted.forget()
    monkeypatch.setattr(_flop_search, "gradient_flops", counting)
    yield programs
    _counted.forget()


def plan_at(fraction, params, x):
    budget = int(remat_opt.peak_bytes(mlp, params, x) * fraction)
    return remat_opt.optimize(mlp, budget, cache=False).plan(params, x)


def test_a_sweep_counts_each_schedule_once_with_the_same_plans(traced):
    params = [jnp.full((64, 64), 0.01 * (i + 1)) for i in range(8)]
    x = jnp.ones((1024, 64))
    first = plan_at(0.8, params, x)
    counted = len(traced)
    assert counted > 0
    again = plan_at(0.8, params, x)
    # Counted again: what the returned plan's own figures need (here 1 program of 10).
    assert len(traced) - counted < counted
    _counted.forget()
    before = len(traced)
    fresh = plan_at(0.8, params, x)
    assert len(traced) - before == counted  # nothing else saved the traces
    for plan in (again, fresh):
        assert (plan.schedule, plan.measured_peak_bytes, plan.measured_recompute_flops) == (
            first.schedule, first.measured_peak_bytes, first.measured_recompute_flops)


def test_another_program_is_counted_afresh(traced):
    params = [jnp.full((64, 64), 0.01 * (i + 1)) for i in range(8)]
    plan_at(0.8, params, jnp.ones((1024, 64)))
    counted = len(traced)
    plan_at(0.8, params, jnp.ones((512, 64)))  # another batch: another program, another key
    assert len(traced) - counted >= counted - 1  # the schedules counted again (its plan may be another)


class Priced:
    """A cost model that is not a dataclass: the program's key names only its type."""

    def __init__(self, scale):
        self.scale = scale

    def eqn_flops(self, eqn):
        return self.scale * sum(getattr(v.aval, "size", 1) for v in eqn.outvars)


def test_a_cost_model_the_key_cannot_name_is_counted_every_time(traced):
    params = [jnp.full((64, 64), 0.01 * (i + 1)) for i in range(8)]
    x = jnp.ones((1024, 64))
    budget = int(remat_opt.peak_bytes(mlp, params, x) * 0.8)
    remat_opt.optimize(mlp, budget, cache=False, cost_model=Priced(1)).plan(params, x)
    counted = len(traced)
    remat_opt.optimize(mlp, budget, cache=False, cost_model=Priced(2)).plan(params, x)
    # Counted again, none served from the first plan's counts (the second search may measure more:
    # a schedule of the program's front, say, whose count is taken too).
    assert len(traced) - counted >= counted


def test_the_whole_function_policies_are_counted_once(monkeypatch):
    counted = []
    count = _policy_planning.gradient_flops
    monkeypatch.setattr(_policy_planning, "gradient_flops", lambda *a, **k: counted.append(1) or count(*a, **k))
    _counted.forget()
    params = [jnp.full((64, 64), 0.01 * (i + 1)) for i in range(8)]
    x = jnp.ones((1024, 64))
    first = plan_at(0.8, params, x)
    assert len(counted) == len(POLICIES)
    again = plan_at(0.7, params, x)  # another budget, the same program
    assert len(counted) == len(POLICIES)
    assert first.measured_peak_bytes <= int(remat_opt.peak_bytes(mlp, params, x) * 0.8)
    assert again.measured_peak_bytes <= int(remat_opt.peak_bytes(mlp, params, x) * 0.7)
    _counted.forget()
