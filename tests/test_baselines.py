"""Baseline strategies: exact gradients, and figures that match independent measurements."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import Schedule, peak_bytes
from remat_opt.baselines import BaselineCall, reference
from remat_opt.memory import model_graph
from remat_opt.memory import gradient_flops, memory_of
from remat_opt.memory import calibrate
from remat_opt.memory import simulate
from remat_opt.program import trace
from remat_opt.rewrite import apply_schedule
from remat_opt.rewrite import POLICIES
from remat_opt.rewrite import fenced_checkpoint
from remat_opt.solve import articulation_positions, chen_greedy_schedule, chen_sqrt_n_schedule
from remat_opt.zoo import MODELS, GPTConfig, UNetConfig

CONFIG = GPTConfig(num_layers=2, d_model=32, num_heads=2, seq_len=32, batch=2, vocab=64)
BUDGET = 1 << 30
POLICIES_TESTED = ("nothing_saveable", "dots_with_no_batch_dims_saveable")
# Chen's plans run through the fenced rewriter, so the model should describe
# them. The bounds are loose for a model this small (a few KiB of activations
# against XLA's per-buffer overheads); under-prediction, the dangerous
# direction, is held tighter.
CHEN_OVER_PREDICTION = 0.20
CHEN_UNDER_PREDICTION = 0.05
# Revolve's trees nest checkpoints three levels deep; on this GPT the model's
# error on them spans -12% to +20% (exact on the MLP's chain, test_nesting).
REVOLVE_FIDELITY = 0.20


@pytest.fixture(scope="module")
def gpt():
    spec = MODELS["gpt"]
    params, batch = spec.init(CONFIG, jax.random.PRNGKey(0))
    return spec.loss, params, batch


@pytest.fixture(scope="module")
def graph(gpt):
    """The program graph as every strategy's is: with XLA's facts about the plain
    compile (a transpose's scratch among them), calibrated on its peak."""
    loss, params, batch = gpt
    return reference(BaselineCall(loss, (params, batch), budget_bytes=BUDGET)).graph


@pytest.fixture(scope="module")
def plain_step(gpt):
    """The plain gradient step, compiled once: its peak and its gradients are the references."""
    loss, params, batch = gpt
    return jax.jit(jax.value_and_grad(loss)).lower(params, batch).compile()


@pytest.fixture(scope="module")
def plans(gpt):
    loss, params, batch = gpt
    # Two policies keep the test fast; the per-layer dots policy is also Megatron's.
    plans = remat_opt.all_baselines(BaselineCall(loss, (params, batch), budget_bytes=BUDGET), policies=POLICIES_TESTED,
                                    measure_top=1)
    return {p.strategy: p for p in plans}


def independent_program(strategy, loss, graph, plan):
    """The program each strategy stands for, built here from JAX's public API."""
    if strategy == "no_remat":
        return loss
    if strategy == "megatron_selective":
        strategy = "layer_checkpoint/dots_with_no_batch_dims_saveable"
    kind, _, name = strategy.partition("/")
    if kind == "checkpoint":
        return jax.checkpoint(loss, policy=getattr(jax.checkpoint_policies, name))
    if kind == "layer_checkpoint":
        policy = getattr(jax.checkpoint_policies, name)
        return functools.partial(loss, layer_wrapper=lambda f: jax.checkpoint(f, policy=policy))
    if kind == "fenced_layer_checkpoint":
        policy = getattr(jax.checkpoint_policies, name)
        return functools.partial(loss, layer_wrapper=lambda f: fenced_checkpoint(f, (), policy=policy))
    return apply_schedule(loss, graph, plan.schedule)


def test_every_strategy_is_present(plans):
    expected = {"no_remat", "megatron_selective", "chen_sqrt_n", "chen_greedy", "revolve"}
    expected |= {f"{kind}/{p}" for kind in ("checkpoint", "layer_checkpoint", "fenced_layer_checkpoint")
                 for p in POLICIES_TESTED}
    assert set(plans) == expected
    assert set(POLICIES) == {"nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                             "everything_saveable"}


def test_gradients_exact_and_peaks_match_xla(gpt, graph, plans, plain_step):
    loss, params, batch = gpt
    value, reference = plain_step(params, batch)
    assert plans["no_remat"].measured_peak_bytes == memory_of(plain_step)
    for strategy, plan in plans.items():
        if strategy in ("no_remat", "megatron_selective"):  # the plain program; a duplicate
            continue
        program = independent_program(strategy, loss, graph, plan)
        compiled = jax.jit(jax.value_and_grad(program)).lower(params, batch).compile()
        assert plan.measured_peak_bytes == memory_of(compiled), strategy
        got_value, grads = compiled(params, batch)
        np.testing.assert_allclose(got_value, value, rtol=1e-5, atol=1e-6)
        for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference)):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=strategy)


def test_common_fields(gpt, plans, plain_step):
    loss, params, batch = gpt
    plain = memory_of(plain_step)
    flops = gradient_flops(loss, (params, batch), {}, 0)
    for plan in plans.values():
        assert plan.plain_peak_bytes == plain and plan.baseline_flops == flops
        assert plan.budget_bytes == BUDGET and plan.fits
        assert plan.status == "BASELINE" and plan.jax_version == jax.__version__
        assert plan.graph.number_of_nodes() > 0
        assert str(plan).startswith(f"Plan[{plan.strategy}]")


def test_recompute_flops(gpt, graph, plans):
    loss, params, batch = gpt
    flops = gradient_flops(loss, (params, batch), {}, 0)
    for strategy, plan in plans.items():
        program = independent_program(strategy, loss, graph, plan)
        extra = gradient_flops(program, (params, batch), {}, 0) - flops
        assert plan.measured_recompute_flops == extra, strategy
    assert plans["no_remat"].recompute_flops == plans["no_remat"].measured_recompute_flops == 0
    assert plans["no_remat"].measured_peak_bytes == plans["no_remat"].plain_peak_bytes
    for kind in ("checkpoint", "layer_checkpoint"):
        nothing = plans[f"{kind}/nothing_saveable"].measured_recompute_flops
        assert nothing > plans[f"{kind}/dots_with_no_batch_dims_saveable"].measured_recompute_flops > 0
    # Chen recomputes every segment whole: the model's count is the jaxpr's.
    for strategy in ("chen_sqrt_n", "chen_greedy", "revolve"):
        plan = plans[strategy]
        assert plan.recompute_flops > 0
        assert abs(plan.recompute_flops - plan.measured_recompute_flops) <= 0.01 * plan.baseline_flops, str(plan)


def test_predictions(graph, plans):
    no_remat = plans["no_remat"]
    assert no_remat.schedule == Schedule(plain=True)
    assert no_remat.predicted_peak_bytes == simulate(graph, Schedule(plain=True)).peak_bytes
    for strategy, plan in plans.items():
        if strategy.startswith(("checkpoint/", "layer_checkpoint/", "fenced_layer_checkpoint/")) \
                or strategy == "megatron_selective":
            assert plan.predicted_peak_bytes is None and plan.schedule is None and plan.num_segments is None
    for strategy in ("chen_sqrt_n", "chen_greedy", "revolve"):
        plan = plans[strategy]
        assert plan.num_segments > 1
        assert plan.predicted_peak_bytes == simulate(graph, plan.schedule).peak_bytes
        error = (plan.predicted_peak_bytes - plan.measured_peak_bytes) / plan.measured_peak_bytes
        if strategy == "revolve":
            assert abs(error) <= REVOLVE_FIDELITY, str(plan)
        else:
            assert -CHEN_UNDER_PREDICTION <= error <= CHEN_OVER_PREDICTION, str(plan)
        # Segmenting is what lowers memory on XLA:CPU (docs/xla_findings.md §1, §2).
        assert plan.measured_peak_bytes < no_remat.measured_peak_bytes


def test_megatron_is_the_per_layer_dots_policy(plans):
    a, b = plans["megatron_selective"], plans["layer_checkpoint/dots_with_no_batch_dims_saveable"]
    assert (a.measured_peak_bytes, a.measured_recompute_flops) == (b.measured_peak_bytes, b.measured_recompute_flops)


def _chain(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x)


def _skip(ws, x):
    h1 = jnp.tanh(x @ ws[0])
    h2 = jnp.tanh(h1 @ ws[1])
    return jnp.sum(jnp.tanh(h2 @ ws[2]) + h1)


def _graph(fn, n=4):
    ws = [jnp.full((8, 8), 0.1) for _ in range(n)]
    return model_graph(trace(fn, (ws, jnp.ones((4, 8))), {}, (0,)))


def test_articulation_positions_by_hand():
    # A chain (dot, tanh per layer, then the sum) has one live value at every boundary.
    assert articulation_positions(_graph(_chain, 4)) == tuple(range(1, 9))
    # Skip: positions 0 dot, 1 tanh (h1), 2 dot, 3 tanh, 4 dot, 5 tanh, 6 add h1, 7 sum.
    # Alone across a boundary: the first dot's output (1), h1 (2), the add's output (7);
    # at 3..6 h1 crosses next to the chain's current value.
    assert articulation_positions(_graph(_skip, 3)) == (1, 2, 7)


def test_chen_schedules_on_a_chain():
    graph = _graph(_chain, 12)  # 25 positions: k = 5 segments
    assert graph.num_positions == 25
    sqrt_n = chen_sqrt_n_schedule(graph)
    # Every boundary of a chain crosses the same bytes, so the cuts are the even split.
    assert sqrt_n == Schedule(cuts=frozenset({5, 10, 15, 20}))
    assert chen_sqrt_n_schedule(graph, 1) == Schedule()
    assert chen_greedy_schedule(graph, 1 << 40) == Schedule()
    # With a zero budget a segment ends right after each tanh (the residual-making positions).
    assert chen_greedy_schedule(graph, 0) == Schedule(cuts=frozenset(range(2, 25, 2)))
    # Late: each cut moves past the dot that follows it, which makes no residual (the tanh's
    # derivative reads the tanh's output), to the last candidate before the next tanh.
    assert chen_greedy_schedule(graph, 0, late=True) == Schedule(cuts=frozenset({*range(3, 24, 2), 24}))


def test_argument_errors(gpt):
    loss, params, batch = gpt
    with pytest.raises(ValueError, match="policy must be one of"):
        remat_opt.checkpoint_policy(BaselineCall(loss, (params, batch), budget_bytes=BUDGET), "save_everything")
    with pytest.raises(TypeError, match="layer_wrapper"):
        remat_opt.layer_checkpoint_policy(BaselineCall(lambda p, b: loss(p, b), (params, batch), budget_bytes=BUDGET),
                                          "dots_saveable")
    with pytest.raises(ValueError, match="budget_bytes"):
        remat_opt.no_remat(BaselineCall(loss, (params, batch), budget_bytes=-1))
    with pytest.raises(ValueError, match="num_segments"):
        remat_opt.chen_sqrt_n(BaselineCall(loss, (params, batch), budget_bytes=BUDGET), num_segments=0)


@pytest.mark.xfail(not jax.__version__.startswith("0.10."), strict=False, reason=(
    "jax 0.12's XLA:CPU measures this plan one 4x32x8 float32 activation lower than jax 0.10.2's "
    "(150,724 against 154,820 bytes) for the same schedule and the same prediction (160,716): +6.6%, "
    "a safe over-prediction; which buffer XLA 0.12 saves is not traced yet"))
def test_stored_activations_smaller_than_a_weight_sit_in_its_gradient_buffer():
    """U-Net activations are smaller than its convolution weights; XLA lays them
    over the unwritten gradient buffers all the same (_slots.assign_stored_buffers).
    Measured: Chen's plan predicted +3.8% (+12.0% by the same-size rule CP-SAT plans with)."""
    spec = MODELS["unet"]
    params, batch = spec.init(UNetConfig(length=32, in_channels=2, out_channels=1, widths=(8, 16, 32), batch=4),
                              jax.random.PRNGKey(0))
    plan = remat_opt.chen_sqrt_n(BaselineCall(spec.loss, (params, batch), budget_bytes=BUDGET))
    assert plan.num_segments > 2
    error = plan.predicted_peak_bytes / plan.measured_peak_bytes - 1
    assert abs(error) <= 0.05, str(plan)
    graph = calibrate(model_graph(trace(spec.loss, (params, batch), {}, (0,))), peak_bytes(spec.loss, params, batch))
    assert simulate(graph, plan.schedule, planning=True).peak_bytes > 1.08 * plan.measured_peak_bytes


def test_the_baselines_of_one_call_measure_its_plain_program_once(monkeypatch):
    import remat_opt.baselines._reference as reference_module

    compiled = []
    counting = lambda fn, *a, **k: compiled.append(fn) or peak_bytes(fn, *a, **k)  # noqa: E731
    monkeypatch.setattr(reference_module, "peak_bytes", counting)

    def loss(w, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w))

    w, x = jnp.ones((16, 16)), jnp.ones((8, 16))
    first = remat_opt.no_remat(BaselineCall(loss, (w, x), budget_bytes=BUDGET))
    second = remat_opt.no_remat(BaselineCall(loss, (w, x), budget_bytes=BUDGET // 2))
    assert compiled.count(loss) == 1 and first.measured_peak_bytes == second.measured_peak_bytes
    assert second.budget_bytes == BUDGET // 2  # the budget is the call's own, not the first's
    # Other arguments, or another cost model, are another plain program.
    remat_opt.no_remat(BaselineCall(loss, (w, jnp.ones((4, 16))), budget_bytes=BUDGET))
    halved = remat_opt.no_remat(BaselineCall(loss, (w, x), budget_bytes=BUDGET,
                                             cost_model=_HalfFlops()))
    assert compiled.count(loss) == 3 and halved.baseline_flops * 2 == pytest.approx(first.baseline_flops, rel=0.01)


class _HalfFlops:
    """Half of the default FLOPs of every equation: another cost model, with other figures."""

    def eqn_flops(self, eqn) -> int:
        from remat_opt.program import FlopCostModel

        return FlopCostModel().eqn_flops(eqn) // 2
