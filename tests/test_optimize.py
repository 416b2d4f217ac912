"""The whole pipeline, judged by XLA and by plain jax.grad."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import Schedule, peak_bytes
from remat_opt.baselines import BaselineCall, reference
from remat_opt.memory import model_graph
from remat_opt.memory import abstract
from remat_opt.memory._once import once_values
from remat_opt.memory import calibrate
from remat_opt.memory import simulate
from remat_opt.program import trace
from remat_opt.rewrite import apply_schedule
from remat_opt.zoo import gpt


def max_abs_diff(a, b):
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in pairs)

# Predicted against measured peak (jax 0.10.2, XLA:CPU), at 0.85, 0.7 and 0.6
# of the plain peak: +5.2%, +0.8%, +3.5% before saved names were laid over
# gradient slots, -1.2%, -1.9%, +1.3% after (it was 0.15 before the model
# credited rematerialized buffers in slots; docs/measurements.md, "Fidelity").
# The plans below are at 0.85 and 0.6 only: 0.7 took no other path.
FIDELITY = 0.05
FAST = remat_opt.SolverOptions(time_limit_s=120.0, deterministic_time_limit=3.0, num_workers=2)


@pytest.fixture(scope="module")
def gpt_plans(small_gpt):
    loss, params, batch = small_gpt
    plain = peak_bytes(loss, params, batch)
    plans = {}
    for frac in (0.85, 0.6):
        step = remat_opt.optimize(loss, int(plain * frac), solver_options=FAST)
        plans[frac] = (step, step.plan(params, batch))
    return plain, plans


def test_budgets_met_on_xla_with_exact_gradients(small_gpt, gpt_plans):
    loss, params, batch = small_gpt
    plain, plans = gpt_plans
    reference = jax.grad(loss)(params, batch)
    for frac, (step, plan) in plans.items():
        assert plan.measured_peak_bytes <= plan.budget_bytes < plain
        # The figure on the plan is what a user measures independently.
        assert peak_bytes(step, params, batch) == plan.measured_peak_bytes
        value, grads = jax.jit(jax.value_and_grad(step))(params, batch)
        np.testing.assert_allclose(value, loss(params, batch), rtol=1e-5, atol=1e-6)
        for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference)):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_predicted_peak_close_to_measured(gpt_plans):
    _, plans = gpt_plans
    for plan in (p for _, p in plans.values()):
        error = abs(plan.predicted_peak_bytes - plan.measured_peak_bytes) / plan.measured_peak_bytes
        assert error <= FIDELITY, str(plan)


def test_recompute_flops_match_rewritten_jaxpr(gpt_plans):
    _, plans = gpt_plans
    for plan in (p for _, p in plans.values()):
        assert plan.recompute_flops > 0
        # The model's count against what the rewritten jaxpr computes beyond the plain gradient.
        assert abs(plan.recompute_flops - plan.measured_recompute_flops) <= 0.01 * plan.recompute_flops, str(plan)


def test_stored_values_computed_once_lower_xla_peak(small_gpt, gpt_plans):
    # compute_saved_once is on by default (remat_opt.memory._once): the plan at 0.85 stores
    # values computed once, and the same schedule without the conditionals holds more on XLA.
    loss, params, batch = small_gpt
    _, plan = gpt_plans[1][0.85]
    ref = reference(BaselineCall(loss, (params, batch), budget_bytes="1GiB"))
    assert plan.schedule.saved
    assert plan.computed_once == len(once_values(ref.graph, plan.schedule)) > 0
    assert f"{plan.computed_once} stored value(s) computed once" in str(plan)
    without = ref.peak(apply_schedule(ref.fn, ref.graph, plan.schedule, compute_saved_once=False))
    assert plan.measured_peak_bytes < without


def test_plan_graph_carries_decisions(small_gpt, gpt_plans):
    _, plans = gpt_plans
    graph = plans[0.6][1].graph
    decisions = {d for _, d in graph.nodes(data="decision")}
    assert {"input", "save", "recompute", "output"} <= decisions
    _, params, batch = small_gpt
    inputs = [v for v, d in graph.nodes(data="decision") if d == "input"]
    assert len(inputs) == len(jax.tree_util.tree_leaves((params, batch)))
    labels = {graph.nodes[v]["name"] for v in inputs}
    assert "args[1]['tokens']" in labels and any(label.startswith("args[0]['layers'][0]") for label in labels)
    assert all(graph.out_degree(v) > 0 for v in inputs if "tokens" in graph.nodes[v]["name"])
    for _, data in graph.nodes(data=True):
        assert data["bytes"] == int(np.prod(data["shape"])) * np.dtype(data["dtype"]).itemsize
        assert {"primitive", "flops", "segment", "source"} <= set(data)
    assert "predicted peak" in str(plans[0.6][1])
    # On by default (tests/test_once.py); the count is on the plan only where it applies.
    once = plans[0.6][1].computed_once
    assert (once > 0) == bool(plans[0.6][1].schedule.saved)
    assert ("computed once" in str(plans[0.6][1])) == (once > 0)


def _line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return f"{inspect.getsourcefile(fn)}:{first + next(i for i, line in enumerate(lines) if text in line)}"


def test_every_zoo_gpt_value_names_its_line_in_the_model(gpt_plans):
    # Issue 24 (tests/test_report.py checks the lines on a program of its own). The only nodes
    # without a line are the program's inputs (primitive "input"): arguments, not equations.
    # Before the fix about 12% of the values (81 of 677 here) named none: the bodies of
    # jnp.where, jnp.tril, jnp.take, softmax, ... are jaxprs JAX caches with tracebacks that
    # stop at the jit boundary; they now take their call site's line.
    plan = gpt_plans[1][0.6][1]  # the small GPT's plan at 0.6 of its plain peak
    assert plan.num_segments > 1, str(plan)
    sources = {v: d["source"] for v, d in plan.graph.nodes(data=True) if d["primitive"] != "input"}
    model = inspect.getsourcefile(gpt)
    elsewhere = {v: s for v, s in sources.items() if not s.startswith(model + ":")}
    assert not elsewhere, f"{len(elsewhere)} of {len(sources)} values name no line of the model: {elsewhere}"
    by_primitive = {}
    for v, d in plan.graph.nodes(data=True):
        by_primitive.setdefault(d["primitive"], set()).add(d["source"])
    # Values computed inside jitted jax.numpy functions name the user's line that called them.
    assert _line_of(gpt.block, "jnp.where(causal") in by_primitive["select_n"]
    assert _line_of(gpt.block, "jnp.tril(") in by_primitive["iota"]
    assert _line_of(gpt._embed, "jnp.take(") in by_primitive["gather"]


def test_budget_above_plain_peak_changes_nothing(small_mlp):
    fn, params, x = small_mlp
    plain = peak_bytes(fn, params, x)
    step = remat_opt.optimize(fn, plain)
    plan = step.plan(params, x)
    assert plan.status == "PLAIN" and plan.recompute_flops == 0
    assert plan.measured_peak_bytes == plain
    assert max_abs_diff(jax.grad(step)(params, x), jax.grad(fn)(params, x)) == 0.0


def test_mlp_budget_between_min_and_plain(small_mlp):
    fn, params, x = small_mlp
    plain = peak_bytes(fn, params, x)
    step = remat_opt.optimize(fn, int(plain * 0.85))
    plan = step.plan(params, x)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert max_abs_diff(jax.grad(step)(params, x), jax.grad(fn)(params, x)) < 1e-6
    # Planned for argnums=0, differentiated in x too: x's cotangent crosses the fenced segments.
    assert not plan.schedule.plain
    want = jax.grad(fn, argnums=1)(params, x)
    assert float(jnp.max(jnp.abs(want))) > 0
    assert max_abs_diff(jax.grad(step, argnums=1)(params, x), want) < 1e-6
    assert max_abs_diff(jax.vjp(step, params, x)[1](1.0)[1], want) < 1e-6
    assert max_abs_diff(jax.jit(jax.grad(step, argnums=(0, 1)))(params, x), jax.grad(fn, argnums=(0, 1))(params, x)) < 1e-6


def test_same_inputs_same_plan(small_mlp):
    fn, params, x = small_mlp
    budget = int(peak_bytes(fn, params, x) * 0.85)
    a = remat_opt.optimize(fn, budget, cache=False).plan(params, x)
    b = remat_opt.optimize(fn, budget, cache=False).plan(params, x)  # solved again, not loaded
    assert a.schedule == b.schedule and a.measured_peak_bytes == b.measured_peak_bytes


def test_plan_is_cached_per_signature(small_mlp):
    fn, params, x = small_mlp
    step = remat_opt.optimize(fn, "1GiB")
    assert step.plan(params, x) is step.plan(params, x)
    assert step.plan(params, x[:512]) is not step.plan(params, x)


@pytest.mark.parametrize(
    "fn, budget, argnums, error",
    [
        (42, "1GiB", 0, TypeError),
        (jnp.sum, 0, 0, ValueError),
        (jnp.sum, -5, 0, ValueError),
        (jnp.sum, float("nan"), 0, ValueError),
        (jnp.sum, True, 0, TypeError),
        (jnp.sum, "lots", 0, ValueError),
        (jnp.sum, "1GiB", "0", TypeError),
    ],
)
def test_bad_arguments_raise_typed_errors(fn, budget, argnums, error):
    with pytest.raises(error) as info:
        remat_opt.optimize(fn, budget, argnums=argnums)
    assert any(word in str(info.value) for word in ("fn", "budget_bytes", "argnums"))


def test_bad_call_arguments_raise_typed_errors(small_mlp):
    fn, params, x = small_mlp
    with pytest.raises(ValueError, match="argnums"):
        remat_opt.optimize(fn, "1GiB", argnums=5).plan(params, x)
    with pytest.raises(TypeError, match=r"args\[1\] is an array of dtype <U5, which JAX cannot trace"):
        remat_opt.optimize(fn, "1GiB").plan(params, np.array(["not", "an", "array"]))


def test_calibration_fits_the_plain_peak(small_gpt):
    loss, params, batch = small_gpt
    plain = peak_bytes(loss, params, batch)
    graph = model_graph(trace(loss, abstract((params, batch)), {}, (0,)))
    calibrated = calibrate(graph, plain)
    assert calibrated.plain_storage_scale != 1.0  # the model alone is off on this GPT
    predicted = simulate(calibrated, Schedule(plain=True)).peak_bytes
    assert abs(predicted - plain) <= 0.005 * plain


def test_measured_slack_loosens_the_target(small_mlp, monkeypatch):
    # A model that over-counts what code run as written keeps (its calibrated
    # storage scaled by 1.3) over-predicts the first plan; fed back, the error
    # loosens the target, and the plan that wins recomputes less than the
    # first one that fit, still within the budget.
    import remat_opt.planner._flop_search as flop_search

    fn, params, x = small_mlp
    plain = peak_bytes(fn, params, x)
    inflate = lambda graph, peak: dataclasses.replace(calibrate(graph, peak), plain_storage_scale=1.3,  # noqa: E731
                                                     planning_storage_scale=1.3)
    monkeypatch.setattr(flop_search, "calibrate", inflate)
    plans = {}
    for slack in (1.0, remat_opt.OptimizedFunction.RELAX_SLACK):
        monkeypatch.setattr(remat_opt.OptimizedFunction, "RELAX_SLACK", slack)
        # Chen's start, not the block decomposition's: that one fits within 2% of the
        # budget at once, leaving no slack for this test to steer by.
        options = dataclasses.replace(FAST, blocks=False)
        plans[slack] = remat_opt.optimize(fn, int(0.9 * plain), solver_options=options).plan(params, x)
    first, steered = plans[1.0], plans[remat_opt.OptimizedFunction.RELAX_SLACK]
    assert first.attempts == 1 and first.measured_peak_bytes < 0.98 * first.budget_bytes
    assert steered.attempts > 1
    assert steered.measured_peak_bytes <= steered.budget_bytes
    assert steered.measured_recompute_flops < first.measured_recompute_flops


def test_gelu_backward_holds_tanh_and_fuses_what_is_derived_from_it():
    """XLA holds a GELU's tanh output for its backward and recomputes the cheap
    values JAX's JVP derives from it (1 - tanh², 0.5 (1 + tanh)) in the backward's
    fusions. jax 0.10 lists tanh's output as a residual; jax 0.12 only lists
    one_minus_square of it, which the model must still fuse (remat_opt.memory._fusion)."""
    def mlp(ws, x):
        return jnp.sum(jax.nn.gelu(x @ ws[0]) @ ws[1])

    ws = [jax.ShapeDtypeStruct((64, 256), jnp.float32), jax.ShapeDtypeStruct((256, 64), jnp.float32)]
    graph = model_graph(trace(mlp, (ws, jax.ShapeDtypeStruct((128, 64), jnp.float32)), {}, (0,)))
    (tanh,) = [u for u in graph.units if u.primitive == "tanh"]
    (t,) = tanh.outputs
    assert graph.held[t] or (graph.residual[t] and not graph.fused[t])
    # The residuals JAX derives from tanh's output in its own equation (same size, same position).
    derived = [
        v for v in range(graph.num_nodes)
        if graph.residual[v] and v != t and graph.position_of(v) == tanh.position
        and graph.node_bytes[v] == graph.node_bytes[t]
    ]
    assert derived and all(graph.fused[v] for v in derived)


def test_complex_intermediates_cross_segments_with_their_gradients():
    """A complex value that carries a gradient may cross a segment boundary. It cannot be saved
    by name (JAX's policies reject complex residuals), and its cotangent must reach the earlier
    layers: a boundary once cut complex values off as if they were integers (zero gradients for
    the first layers' weights)."""
    def fn(ws, x):
        for w in ws:
            z = jax.lax.complex(x @ w, x) * jnp.exp(1j * 0.5).astype(jnp.complex64)
            x = jnp.tanh(jnp.real(z * jnp.conj(z)))
        return jnp.mean(x ** 2)

    key = jax.random.PRNGKey(3)
    ws = [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(4)]
    x = jax.random.normal(key, (256, 64))
    budget = int(peak_bytes(fn, ws, x) * 0.7)
    step = remat_opt.optimize(fn, budget, cache=False)
    plan = step.plan(ws, x)
    assert plan.measured_peak_bytes <= budget and (plan.layer_plan is not None or not plan.schedule.plain)
    got, want = jax.grad(step)(ws, x), jax.grad(fn)(ws, x)
    assert float(jnp.max(jnp.abs(want[0]))) > 0
    assert max_abs_diff(got, want) < 1e-5 * float(max(jnp.max(jnp.abs(w)) for w in want))
