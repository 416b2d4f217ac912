"""Loop plans: a scan kept as a loop, its body under a policy, its iterations nested."""

import dataclasses
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat_opt
from remat_opt.planner._loop_planning import LoopSearch
from remat_opt.memory import model_graph
from remat_opt.memory import gradient_flops
from remat_opt.rewrite import LoopPlan, loop_candidates, loop_program, scan_lengths
from remat_opt.memory import calibrate
from remat_opt.memory import simulate
from remat_opt.program._trace import grad_argnums, normalize_argnums, trace, with_signature
from remat_opt._schedule import Schedule

LAYERS, WIDTH, BATCH = 6, 32, 128


def _setup():
    key = jax.random.PRNGKey(0)
    stack = jax.random.normal(key, (LAYERS, WIDTH, WIDTH)) / 6
    bias = jax.random.normal(jax.random.fold_in(key, 1), (LAYERS, WIDTH)) / 10
    w_in = jax.random.normal(jax.random.fold_in(key, 2), (WIDTH, WIDTH)) / 6
    x = jax.random.normal(jax.random.fold_in(key, 3), (BATCH, WIDTH))
    return (stack, bias, w_in), x


def loss(params, x, reverse=False):
    stack, bias, w_in = params

    def body(carry, layer):
        h, total = carry
        w, b = layer
        h = jnp.tanh(h @ w + b) + jnp.sin(h @ w_in)  # w_in: a constant of the scan
        return (h, total + jnp.mean(h)), jnp.sum(h * h, axis=-1)  # two carries and a stacked output

    (h, total), ys = lax.scan(body, (x, jnp.float32(0)), (stack, bias), reverse=reverse)
    return jnp.mean(h**2) + total + jnp.mean(ys[::2])


def test_candidates_are_the_hand_written_alternatives():
    plans = loop_candidates([12])
    assert {p.chunks for p in plans} == {1, 3, 4}  # the group counts nearest sqrt(12)
    assert len(plans) == 5 * 3 - 2  # policies (and none) x groups, minus the program as written twice
    assert LoopPlan(None, 1) not in plans and LoopPlan("everything_saveable", 1) not in plans
    assert LoopPlan("nothing_saveable", 1) in plans and LoopPlan(None, 4) in plans
    assert {p.chunks for p in loop_candidates([7])} == {1}  # a prime length cannot be grouped evenly
    assert "dots_saveable" in str(LoopPlan("dots_saveable", 3)) and "3 checkpointed groups" in str(
        LoopPlan("dots_saveable", 3))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_every_loop_plan_keeps_values_and_gradients(reverse):
    params, x = _setup()
    fn = lambda p, x: loss(p, x, reverse)  # noqa: E731
    traced = trace(fn, (params, x), {}, (0,))
    assert scan_lengths(traced) == [LAYERS]
    want_value, want_grad = jax.jit(jax.value_and_grad(fn))(params, x)
    # A policy on the body, nested groups, and both (each compile takes seconds).
    for plan in [LoopPlan("nothing_saveable", 1), LoopPlan(None, 2), LoopPlan("dots_saveable", 3)]:
        program = with_signature(fn, traced, loop_program(traced, plan))
        value, grad = jax.jit(jax.value_and_grad(program))(params, x)
        np.testing.assert_allclose(value, want_value, rtol=1e-6, err_msg=str(plan))
        for g, w in zip(jax.tree.leaves(grad), jax.tree.leaves(want_grad)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=str(plan))


def test_loop_plans_lower_xla_peak_as_users_expect():
    # What users write by hand, measured on XLA: remat of the body saves the
    # stacked residuals; grouping the iterations saves more; saving dots less.
    params, x = _setup()
    traced = trace(loss, (params, x), {}, (0,))
    peak = {}
    for plan in [LoopPlan(None, 1), LoopPlan("nothing_saveable", 1), LoopPlan("dots_saveable", 1)]:
        program = with_signature(loss, traced, loop_program(traced, plan))
        peak[plan.policy] = remat_opt.peak_bytes(program, params, x)
    assert peak[None] == remat_opt.peak_bytes(loss, params, x)
    assert peak["nothing_saveable"] < peak["dots_saveable"] < peak[None]


# The body as written in two groups: predicted -11.8% of XLA's peak since the step's last
# segment's cotangent takes a freed residual's buffer (-8.7% before; the other plan went from
# +6.0% to +0.7%): docs/measurements.md, "The netted transient landed".
UNDER = pytest.mark.xfail(strict=True, reason="known gap: under-predicted by 11.8%")


@pytest.mark.parametrize("plan", [pytest.param(LoopPlan(None, 2), marks=UNDER), LoopPlan("nothing_saveable", 3)],
                         ids=["as_written_2_groups", "nothing_saveable_3_groups"])
def test_predicted_peak_counts_each_rerun_of_a_checkpointed_body(plan):
    # A checkpointed group of iterations reruns as an inner scan in the
    # backward and holds that scan's stacked residuals: the model charges it as
    # the scan's transient (it predicted these plans 30-67% under XLA without).
    params, x = _setup()
    traced = trace(loss, (params, x), {}, (0,))
    scale = calibrate(model_graph(traced), remat_opt.peak_bytes(loss, params, x)).plain_storage_scale
    program = with_signature(loss, traced, loop_program(traced, plan))
    graph = model_graph(trace(program, (params, x), {}, (0,)))
    graph = dataclasses.replace(graph, plain_storage_scale=scale)
    (scan,) = [u.index for u in graph.units if u.primitive == "scan"]
    assert graph.inner_bytes[scan] > 0, str(plan)
    predicted = simulate(graph, Schedule(plain=True)).peak_bytes
    measured = remat_opt.peak_bytes(program, params, x)
    without = simulate(dataclasses.replace(graph, inner_bytes=()), Schedule(plain=True)).peak_bytes
    assert without < 0.75 * measured, (str(plan), without, measured)
    assert abs(predicted - measured) <= 0.10 * measured, (str(plan), predicted, measured)


def test_optimize_takes_a_loop_plan_where_it_is_cheapest(caplog):
    params, x = _setup()
    plain = remat_opt.peak_bytes(loss, params, x)
    traced = trace(loss, (params, x), {}, (0,))
    body_remat = with_signature(loss, traced, loop_program(traced, LoopPlan("nothing_saveable", 1)))
    budget = remat_opt.peak_bytes(body_remat, params, x)
    assert budget < plain
    options = remat_opt.SolverOptions(time_limit_s=60, deterministic_time_limit=1.0, num_workers=2)
    step = remat_opt.optimize(loss, budget, solver_options=options, max_attempts=2)
    with caplog.at_level(logging.INFO, logger="remat_opt"):
        plan = step.plan(params, x)
    assert plan.measured_peak_bytes <= budget, str(plan)
    # Whichever plan wins, it reports every CP-SAT solve of the call (a loop plan once said 0 s).
    solves = [float(m) for m in re.findall(r"solve \d+/\d+: .* in ([\d.]+)s", caplog.text)]
    assert solves and plan.solve_seconds >= sum(solves) - 0.05 * len(solves), (solves, str(plan))
    # Whatever won, it recomputes no more than the body remat that fits this budget.
    body_flops = remat_opt.memory._measure.gradient_flops(body_remat, (params, x), {}, 0) - plan.baseline_flops
    assert plan.measured_recompute_flops <= body_flops, str(plan)
    if plan.loop_plan is not None:
        assert plan.recompute_flops == plan.measured_recompute_flops
        assert any(d["primitive"] == "scan" for _, d in plan.graph.nodes(data=True))
    got = jax.grad(step)(params, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(jax.grad(loss)(params, x))):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_no_nested_plan_recomputes_less_than_the_loop_saving_nothing():
    # loop_plans skips tracing a nested plan when the loop saving nothing already
    # recomputes as much as a plan that fits: nesting reruns every iteration's forward.
    params, x = _setup()
    argnums = normalize_argnums(0, 2)
    whole, nums = trace(loss, (params, x), {}, argnums), grad_argnums(argnums)
    baseline = gradient_flops(loss, (params, x), {}, nums, None, False)
    search = LoopSearch(loss, whole, (params, x), {}, argnums, nums, None, False, 1.0, baseline, 0, None, None)
    nothing, _ = search.program(LoopPlan(None, saved=()))
    nested = [search.program(p)[0] for p in loop_candidates(scan_lengths(whole)) if p.chunks > 1]
    assert nested and nothing > 0 and min(nested) >= nothing
