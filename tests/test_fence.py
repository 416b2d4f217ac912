"""The fenced checkpoint's backward: exact cotangents for what the caller differentiates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_opt.rewrite import fenced_checkpoint


def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"]) * x


@pytest.fixture
def inputs():
    key = jax.random.PRNGKey(0)
    p = {"w": jax.random.normal(key, (8, 8)) / 3, "b": jnp.arange(8.0) / 8}
    return p, jax.random.normal(jax.random.fold_in(key, 1), (4, 8))


def loss_of(f):
    return lambda p, x: jnp.sum(f(p, x) ** 2)


@pytest.mark.parametrize("differentiable", [None, (True, False), (False, True)])
@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_cotangents_of_every_differentiated_argument(inputs, differentiable, argnums):
    """A segment planned with some arguments not differentiable (``differentiable``) still gives
    exact cotangents for every argument the caller differentiates, a pytree argument included."""
    fenced = loss_of(fenced_checkpoint(layer, (), differentiable=differentiable))
    got = jax.jit(jax.grad(fenced, argnums=argnums))(*inputs)
    want = jax.grad(loss_of(layer), argnums=argnums)(*inputs)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        scale = float(np.max(np.abs(w)))
        assert scale > 0 and float(np.max(np.abs(g - w))) <= 1e-5 * scale


def test_outputs_nothing_reads_get_zero_cotangents(inputs):
    """Under ``symbolic_zeros`` an output nothing reads arrives as a symbolic zero; the backward
    treats it as zeros (here the second output, and an integer one)."""
    def two(p, x):
        return layer(p, x), jnp.sum(x), jnp.argmax(x, axis=-1)

    def loss(f):
        return lambda p, x: jnp.sum(f(p, x)[0])

    fenced = fenced_checkpoint(two, ())
    got = jax.grad(loss(fenced), argnums=(0, 1))(*inputs)
    want = jax.grad(loss(two), argnums=(0, 1))(*inputs)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert float(np.max(np.abs(g - w))) <= 1e-5 * float(np.max(np.abs(w)))
