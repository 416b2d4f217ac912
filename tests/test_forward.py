"""Forward mode through an optimized function: the function as written, values as plain JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import peak_bytes


def mlp(w, x):
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return jnp.sum(x**2)


@pytest.fixture(scope="module")
def planned():
    w = jax.random.normal(jax.random.PRNGKey(0), (32, 32)) / 6
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 32))
    step = remat_opt.optimize(mlp, int(0.85 * peak_bytes(mlp, w, x)))
    plan = step.plan(w, x)
    assert plan.num_segments > 1  # a real plan, with checkpointed segments
    return step, plan, w, x, jax.random.normal(jax.random.PRNGKey(2), w.shape)


def close(a, b):
    for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(p, q, rtol=2e-5, atol=2e-5)


def test_jvp_and_jacfwd_match_plain_jax(planned):
    step, _, w, x, v = planned
    close(jax.jvp(lambda w: step(w, x), (w,), (v,)), jax.jvp(lambda w: mlp(w, x), (w,), (v,)))
    close(jax.jacfwd(step)(w, x), jax.jacfwd(mlp)(w, x))
    close(jax.jit(lambda w, v: jax.jvp(lambda w: step(w, x), (w,), (v,)))(w, v),
          jax.jvp(lambda w: mlp(w, x), (w,), (v,)))


def test_forward_over_reverse_hessian_vector_product(planned):
    step, _, w, x, v = planned
    hvp = lambda f: jax.jvp(lambda w: jax.grad(f)(w, x), (w,), (v,))[1]
    close(hvp(step), hvp(mlp))
    small = x[:4]
    close(jax.hessian(step)(w, small), jax.hessian(mlp)(w, small))


def test_reverse_mode_keeps_the_plan(planned):
    step, plan, w, x, v = planned
    jax.jvp(lambda w: step(w, x), (w,), (v,))  # forward mode first does not change what grad runs
    close(jax.grad(step)(w, x), jax.grad(mlp)(w, x))
    assert peak_bytes(step, w, x) == plan.measured_peak_bytes < peak_bytes(mlp, w, x)


def test_jvp_of_a_jitted_step(planned):
    """jax.jit traces the step once, with its plan, for every transformation. A plan of bare
    checkpoints (where this compiler honours them) is JAX's own checkpoint, which forward mode goes
    through; a fenced plan's segments are ``custom_vjp`` calls, and JAX's error says to put
    jax.jit outside jax.jvp."""
    step, plan, w, x, v = planned

    def jitted_jvp():
        return jax.jvp(jax.jit(lambda w: step(w, x)), (w,), (v,))

    if plan.schedule.bare:
        close(jitted_jvp(), jax.jvp(lambda w: mlp(w, x), (w,), (v,)))
    else:
        with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
            jitted_jvp()
