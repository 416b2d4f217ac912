"""Whole-function policies as plans: ``jax.checkpoint(fn, policy=...)`` measured beside remat_opt's own.

On some programs XLA keeps less for ``jax.checkpoint(loss,
policy=everything_saveable)`` than for the loss as written, and it recomputes
nothing: at a budget between the two, that is the plan to return, and no
schedule can match it. Which programs is XLA's choice: on jax 0.10 an unrolled
gated recurrent cell with layer norm and gelu, on jax 0.12 an MLP with dropout.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import SolverOptions, peak_bytes
from remat_opt.cache import list_entries

FAST = SolverOptions(time_limit_s=20, deterministic_time_limit=2.0, num_workers=1)


def _layer_norm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * scale + bias


def gated_cell():
    """A gated Elman cell with layer norm and gelu, unrolled 12 steps; a readout of the last state.
    On jax 0.10, XLA keeps 8% less for it under ``everything_saveable`` than as written."""
    batch, steps, d_in, hidden = 64, 12, 16, 96
    rng = np.random.default_rng(0)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0]))

    params = {"wx": normal(d_in, 2 * hidden), "wh": normal(hidden, 2 * hidden), "scale": jnp.ones(hidden),
              "bias": jnp.zeros(hidden), "out": normal(hidden, 8)}
    data = (normal(steps, batch, d_in), normal(batch, 8))

    def gated_cell_loss(params, data):
        xs, y = data
        h = jnp.zeros((batch, hidden))
        for t in range(steps):
            a, g = jnp.split(xs[t] @ params["wx"] + h @ params["wh"], 2, axis=-1)
            gate = jax.nn.sigmoid(g)
            h = gate * jax.nn.gelu(_layer_norm(a, params["scale"], params["bias"])) + (1 - gate) * h
        return jnp.mean(jnp.square(h @ params["out"] - y))

    return gated_cell_loss, params, data


def dropout_mlp():
    """Six tanh layers with dropout from a key argument. On jax 0.12, XLA keeps 30% less for it
    under ``everything_saveable`` than as written."""
    key = jax.random.PRNGKey(0)
    ws = [jax.random.normal(jax.random.fold_in(key, i), (32, 32)) / 6 for i in range(6)]
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 32))

    def dropout_loss(ws, data):
        x, key = data
        for i, w in enumerate(ws):
            x = jnp.tanh(x @ w)
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, x.shape)
            x = jnp.where(keep, x / 0.9, 0.0)
        return jnp.mean(x**2)

    return dropout_loss, ws, (x, jax.random.PRNGKey(2))


@pytest.fixture(scope="module")
def saving_all_keeps_less():
    """The first program of the list for which XLA, on this jax, keeps less under
    ``everything_saveable`` than as written (by 5% or more), with both peaks. Which programs
    do is XLA's choice and moves between releases; the test stands on one that does here."""
    for make in (gated_cell, dropout_mlp):
        fn, params, data = make()
        plain = peak_bytes(fn, params, data)
        call = remat_opt.BaselineCall(fn, (params, data), budget_bytes=plain)
        saving_all = remat_opt.checkpoint_policy(call, "everything_saveable")
        if saving_all.measured_peak_bytes < 0.95 * plain:
            return fn, params, data, plain, saving_all.measured_peak_bytes
    pytest.fail(f"no program here peaks 5% lower under everything_saveable on jax {jax.__version__}")


def test_a_whole_function_policy_that_recomputes_nothing_wins_where_it_fits(saving_all_keeps_less, tmp_path):
    fn, params, data, plain, saving_all = saving_all_keeps_less
    budget = (saving_all + plain) // 2
    step = remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path)
    plan = step.plan(params, data)
    assert plan.whole_policy == "everything_saveable" and plan.status == "OPTIMAL"
    assert plan.measured_recompute_flops == plan.recompute_flops == 0
    assert plan.measured_peak_bytes == saving_all <= budget
    assert plan.predicted_peak_bytes is None  # measured only: the model sees through the checkpoint
    assert "everything_saveable" in str(plan) and "no decisions per value" in plan.report()
    assert peak_bytes(step, params, data) == plan.measured_peak_bytes
    for g, r in zip(jax.tree.leaves(jax.grad(step)(params, data)), jax.tree.leaves(jax.grad(fn)(params, data))):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    # Kept in the plan cache as what it is, and restored as such.
    (entry,) = list_entries(tmp_path)
    assert entry["kind"] == "policy" and entry["valid"] == "ok"
    loaded = remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path).plan(params, data)
    assert loaded.whole_policy == "everything_saveable" and loaded.measured_peak_bytes == plan.measured_peak_bytes



def tied_embedding(p, tokens):
    """A tied embedding and a one-hot cross entropy: ``nothing_saveable`` around it keeps less
    than any schedule the planner measures at a low budget, and the model puts it out of reach."""
    h = jnp.take(p["emb"], tokens, axis=0)
    for _ in range(3):
        h = jnp.tanh(h @ p["w"]) + h
    logits = h @ p["emb"].T
    return -jnp.mean(jnp.sum(jax.nn.one_hot(tokens, p["emb"].shape[0]) * jax.nn.log_softmax(logits), -1))


def test_a_refused_budget_names_a_minimum_under_every_whole_function_policy():
    """Measured (jax 0.10.2, XLA:CPU): at half the plain peak the planner measured no policy
    (the model put each out of reach) and named 0.855 of the plain peak as the minimum, while
    ``nothing_saveable`` around the loss peaks at 0.718; at 0.75 that policy is the plan."""
    keys = jax.random.split(jax.random.key(0), 3)
    p = {"emb": jax.random.normal(keys[0], (1000, 64)) / 8, "w": jax.random.normal(keys[1], (64, 64)) / 8}
    tokens = jax.random.randint(keys[2], (64, 64), 0, 1000)
    plain = peak_bytes(tied_embedding, p, tokens)
    call = remat_opt.BaselineCall(tied_embedding, (p, tokens), budget_bytes=plain)
    policies = {name: remat_opt.checkpoint_policy(call, name)
                for name in remat_opt.POLICIES}
    lowest = min(plan.measured_peak_bytes for plan in policies.values())
    with pytest.raises(remat_opt.InfeasibleBudgetError) as refused:
        remat_opt.optimize(tied_embedding, plain // 2, solver_options=FAST, cache=False).plan(p, tokens)
    assert refused.value.min_budget_bytes <= lowest
