"""A schedule's plan runs bare checkpoints where this backend's compiler honours them and XLA fits
the bare program in the budget; fenced segments otherwise. Either way its gradient is exact,
including the layer norms over a million activations whose gradient jax 0.12.1's XLA:CPU
miscompiles inside a conditional (docs/xla_findings.md §10)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import Schedule, peak_bytes
from remat_opt.memory import model_graph
from remat_opt.memory._barriers import bare_checkpoints_honoured
from remat_opt.planner import _unfenced
from remat_opt.program import trace
from remat_opt.rewrite import apply_schedule

FAST = remat_opt.SolverOptions(time_limit_s=120.0, deterministic_time_limit=3.0, num_workers=2)


def _norm_layer(w, h):
    h = h @ w
    return jax.nn.gelu((h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5))


def _loss(ws, x):
    for w in ws:
        x = _norm_layer(w, x)
    return jnp.mean(x ** 2)


def _exact(got, ws, x):
    """Whether ``got`` (the gradient in ``ws``) is within 1e-4 of the float64 gradient's magnitude."""
    with jax.enable_x64():
        exact = jax.grad(_loss)([np.asarray(w, np.float64) for w in ws], np.asarray(x, np.float64))
    return all(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(e))) <= 1e-4 * np.max(np.abs(np.asarray(e)))
               for g, e in zip(got, exact, strict=True))


def _inputs(layers, rows):
    keys = jax.random.split(jax.random.key(0), layers + 1)
    return [jax.random.normal(k, (256, 256)) / 16 for k in keys[:layers]], jax.random.normal(keys[-1], (rows, 256))


def test_bare_segments_of_layer_norms_at_a_million_activations_have_the_exact_gradient():
    """Two ``gelu(layernorm(h @ w))`` layers over 8192 x 256 activations, a bare segment per layer
    saving nothing: the case whose fenced backward jax 0.12.1's XLA:CPU gets wrong."""
    ws, x = _inputs(2, 8192)
    graph = model_graph(trace(_loss, (ws, x), {}, (0,)))
    cut = next(p for p, e in enumerate(graph.traced.jaxpr.jaxpr.eqns) if p > 0 and e.primitive.name == "dot_general")
    program = apply_schedule(_loss, graph, Schedule(cuts=frozenset({cut}), bare=True))
    assert "cond" not in str(jax.make_jaxpr(jax.grad(program))(ws, x))
    assert _exact(jax.jit(jax.grad(program))(ws, x), ws, x)


def test_a_plan_is_bare_where_the_compiler_honours_it_and_its_gradient_is_exact():
    """Three such layers over 2048 x 256 activations, planned at 0.6x the plain peak: the plan
    fits on XLA, its segments are bare exactly where the compiler honours a bare checkpoint (here
    XLA fits the bare program too), and its gradient is exact."""
    ws, x = _inputs(3, 2048)
    budget = int(0.6 * peak_bytes(_loss, ws, x))
    step = remat_opt.optimize(_loss, budget, cache=False, solver_options=FAST)
    plan = step.plan(ws, x)
    assert plan.schedule is not None and plan.schedule.cuts
    assert plan.schedule.bare == bare_checkpoints_honoured() == ("bare checkpoints" in str(plan))
    assert peak_bytes(step, ws, x) <= budget
    assert _exact(jax.jit(jax.grad(step))(ws, x), ws, x)


def _planned(schedule):
    plan = remat_opt.Plan(graph=None, budget_bytes=1000, predicted_peak_bytes=950, measured_peak_bytes=900,
                          plain_peak_bytes=2000, recompute_flops=20, measured_recompute_flops=None,
                          baseline_flops=10, status="OPTIMAL", gap=0.0, solve_seconds=0.0, attempts=1,
                          schedule=schedule)
    return plan, "fenced program"


@pytest.mark.parametrize("honoured, bare_peak, want_bare", [(True, 800, True), (True, 1100, False), (False, 800, False)])
def test_the_bare_plan_is_returned_only_where_honoured_and_fitting(monkeypatch, honoured, bare_peak, want_bare):
    """With the compiler's answer and the bare program's peak given, against a budget of 1000."""
    monkeypatch.setattr(_unfenced, "bare_checkpoints_honoured", lambda: honoured)
    schedule = Schedule(cuts=frozenset({3, 7}))
    built = []

    def program_of(s):
        built.append(s)
        return "bare program"

    plan, program = _unfenced.unfenced(_planned(schedule), program_of, lambda p: bare_peak, lambda p: 25, 1000)
    assert plan.schedule.bare == want_bare and (program == "bare program") == want_bare
    assert (plan.measured_peak_bytes, plan.measured_recompute_flops) == ((bare_peak, 15) if want_bare else (900, None))
    assert built == ([dataclasses.replace(schedule, bare=True)] if honoured else [])


def test_a_bare_schedule_keeps_its_mark_through_json():
    schedule = Schedule(cuts=frozenset({2, 5}), saved=frozenset({4}), nested=((2, Schedule(cuts=frozenset({3}))),))
    bare = dataclasses.replace(schedule, bare=True)
    assert Schedule.from_json(bare.to_json()) == bare
    assert Schedule.from_json(schedule.to_json()) == schedule and '"bare"' not in schedule.to_json()
