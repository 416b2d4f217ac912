"""A tiny program for the command-line tests (tests/test_cli.py): ``remat-opt plan
cli_program:loss --args cli_program:example_args --budget ...``."""

import jax
import jax.numpy as jnp


def loss(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


def example_args():
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(6)]
    return params, jax.random.normal(key, (1024, 64))


def not_a_tuple():
    return 3


def while_loss(params, x):
    """Differentiates through a lax.while_loop, which remat_opt (like jax.grad) cannot plan."""
    x = jax.lax.while_loop(lambda c: jnp.sum(c[1]) < 10.0, lambda c: (c[0] + 1, c[1] @ params[0]), (0, x))[1]
    return jnp.mean(x**2)
