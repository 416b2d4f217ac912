"""remat_opt against a library's own per-block remat, on a small Equinox encoder.

The user's alternative to remat_opt in Equinox is ``eqx.filter_checkpoint``
around each block, with one of JAX's built-in policies. On a small encoder
written as Equinox users write it (a Python loop over blocks, ``jax.vmap``
over the batch, the module itself differentiated, activation functions as
static leaves), every such variant must give the plain step's gradients, and
remat_opt, asked for the lowest peak any of them reaches on XLA, must fit it
with no more recomputed FLOPs than the best of them that fits.
experiments/library_remat.py runs the same comparison on the held-out library
models, with every other baseline.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import peak_bytes
from remat_opt.memory import gradient_flops

eqx = pytest.importorskip("equinox")

FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=2, seed=0)
BATCH, SEQ, D, HEADS, DEPTH, VOCAB = 4, 32, 64, 4, 2, 64


def encoder(policy_name: str | None):
    """The encoder, with ``eqx.filter_checkpoint(policy)`` around each block when a policy is named.
    The arrays are the same for every choice (one key)."""
    policy = None if policy_name is None else remat_opt.POLICIES[policy_name]

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(D), eqx.nn.LayerNorm(D)
            self.attn = eqx.nn.MultiheadAttention(HEADS, D, key=k1)
            self.mlp = eqx.nn.MLP(D, D, 3 * D, 1, activation=jax.nn.silu, key=k2)

        def __call__(self, x):
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h)
            return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

    class Encoder(eqx.Module):
        embed: eqx.nn.Embedding
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key):
            ke, kb, kh = jax.random.split(key, 3)
            self.embed = eqx.nn.Embedding(VOCAB, D, key=ke)
            self.blocks = [Block(k) for k in jax.random.split(kb, DEPTH)]
            self.head = eqx.nn.Linear(D, VOCAB, key=kh)

        def __call__(self, tokens):
            x = jax.vmap(self.embed)(tokens)
            for block in self.blocks:
                if policy is None:
                    x = block(x)
                else:
                    x = eqx.filter_checkpoint(lambda block, x: block(x), policy=policy)(block, x)
            return jax.vmap(self.head)(x)

    return Encoder(jax.random.PRNGKey(0))


def loss(model, tokens, targets):
    logp = jax.nn.log_softmax(jax.vmap(model)(tokens), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def grads(fn, model, tokens, targets):
    return [g for g in jax.tree.leaves(eqx.filter_jit(eqx.filter_grad(fn))(model, tokens, targets))]


@pytest.fixture(scope="module")
def case():
    tokens = jax.random.randint(jax.random.PRNGKey(1), (BATCH, SEQ), 0, VOCAB)
    targets = jnp.roll(tokens, 1, axis=1)
    plain = encoder(None)
    args = (plain, tokens, targets)
    plain_flops = gradient_flops(loss, args, {}, 0)
    variants = {}
    for name in remat_opt.POLICIES:
        model = encoder(name)
        variants[name] = (model, peak_bytes(loss, model, tokens, targets),
                          gradient_flops(loss, (model, tokens, targets), {}, 0) - plain_flops)
    return args, plain_flops, variants


def test_per_block_checkpoints_give_the_plain_gradients(case):
    (plain, tokens, targets), plain_flops, variants = case
    want = grads(loss, plain, tokens, targets)
    for name, (model, peak, recompute) in variants.items():
        assert len(jax.tree.leaves(model)) == len(jax.tree.leaves(plain))
        for g, w in zip(grads(loss, model, tokens, targets), want, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=name)
        assert peak > 0
    # What each policy recomputes, counted on the jaxpr: everything saved is nothing recomputed;
    # saving nothing recomputes the blocks' forward, which is less than the whole step.
    assert variants["everything_saveable"][2] == 0
    assert 0 < variants["dots_saveable"][2] < variants["nothing_saveable"][2] < plain_flops


def test_no_more_recompute_than_the_best_per_block_checkpoint_that_fits(case):
    args, plain_flops, variants = case
    budget = min(peak for _, peak, _ in variants.values())
    best = min(recompute for _, peak, recompute in variants.values() if peak <= budget)
    step = remat_opt.optimize(loss, budget, solver_options=FAST, max_attempts=2)
    plan = step.plan(*args)
    assert plan.measured_peak_bytes <= budget, str(plan)
    assert plan.measured_recompute_flops <= best, (str(plan), best, plain_flops)
    for g, w in zip(grads(step, *args), grads(loss, *args), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
