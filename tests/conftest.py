"""Shared fixtures: small programs whose gradients and XLA peaks are cheap to check."""

import jax
import jax.numpy as jnp
import pytest

from remat_opt.zoo import MODELS, GPTConfig


def tanh_mlp(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


@pytest.fixture
def small_mlp():
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(6)]
    x = jax.random.normal(key, (1024, 64))
    return tanh_mlp, params, x


@pytest.fixture(scope="session")
def small_gpt():
    spec = MODELS["gpt"]
    config = GPTConfig(num_layers=3, d_model=64, num_heads=2, seq_len=64, batch=2, vocab=64)
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    return spec.loss, params, batch


