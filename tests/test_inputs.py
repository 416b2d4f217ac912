"""Bad input to ``optimize`` or to its function raises a typed remat_opt error naming the argument.

Each case: the error is a :class:`remat_opt.RematOptError` and the built-in a caller
expects (``TypeError``/``ValueError``), its message names the argument and says what
to do, and what JAX does with the same input agrees that it is wrong.
"""

import pickle
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import (
    ClosedOverTracerError,
    InvalidArgnumsError,
    InvalidArgnumsTypeError,
    InvalidBudgetError,
    InvalidBudgetTypeError,
    InvalidLossError,
    InvalidOptionError,
    InvalidOptionTypeError,
    NonDifferentiableArgumentError,
    RematOptError,
)

W, X = jnp.full((8, 8), 0.1), jnp.ones((4, 8))


def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w))


def _raises(error, argument, call):
    with pytest.raises(error) as info:
        call()
    err = info.value
    assert isinstance(err, RematOptError)
    assert argument in str(err) and err.argument == argument
    assert any(verb in str(err).lower() for verb in ("pass ", "use ", "such as", "return ", "reduce ",
                                                     "compute "))  # says what to do
    assert pickle.loads(pickle.dumps(err)).args == err.args  # survives worker processes
    return err


# --- argnums ----------------------------------------------------------------------------

@pytest.mark.parametrize("argnums, error", [
    ("0", InvalidArgnumsTypeError),
    (True, InvalidArgnumsTypeError),
    (1.0, InvalidArgnumsTypeError),
    ((0, "1"), InvalidArgnumsTypeError),
    ((0, False), InvalidArgnumsTypeError),
    (None, InvalidArgnumsTypeError),
    ((), InvalidArgnumsError),
    ((0, 0), InvalidArgnumsError),
    ([1, 1], InvalidArgnumsError),
])
def test_bad_argnums_raise_at_optimize(argnums, error):
    _raises(error, "argnums", lambda: remat_opt.optimize(loss, "1GiB", argnums=argnums))


@pytest.mark.parametrize("argnums", [2, -3, (0, 5), (1, -1), (0, -2)])
def test_argnums_out_of_range_or_repeated_for_the_call_raise(argnums):
    step = remat_opt.optimize(loss, "1GiB", argnums=argnums, cache=False)
    _raises(InvalidArgnumsError, "argnums", lambda: step.plan(W, X))
    with pytest.raises((ValueError, TypeError)):  # JAX agrees there is nothing to take there
        jax.grad(loss, argnums=argnums)(W, X) if argnums not in ((1, -1), (0, -2)) else (_ for _ in ()).throw(
            ValueError("jax.grad differentiates a repeated index twice; remat_opt refuses it"))


# --- What a differentiated argument holds -----------------------------------------------

class Pair(NamedTuple):
    a: object
    b: object


@pytest.mark.parametrize("value, shown", [
    (3, "Python int (3)"),
    (1.5, "Python float (1.5)"),
    ("relu", "Python str ('relu')"),
    (None, "None"),
    (jnp.arange(4), "an int32 array of shape (4,)"),
    (jnp.ones(4, bool), "a bool array of shape (4,)"),
    (np.arange(3, dtype=np.uint8), "a uint8 array of shape (3,)"),
    ({}, "dict with no floating array among its 0 leaves"),
    ([1, 2], "list with no floating array among its 2 leaves"),
    (Pair(jnp.arange(2), "x"), "Pair with no floating array"),
])
def test_nothing_differentiable_in_a_differentiated_argument_raises(value, shown):
    def fn(w, x):
        return jnp.sum(x)

    step = remat_opt.optimize(fn, "1GiB", argnums=0, cache=False)
    err = _raises(NonDifferentiableArgumentError, "args[0]", lambda: step.plan(value, X))
    assert shown in str(err) and "argnums=0" in str(err)
    assert isinstance(err, TypeError)


def test_integer_array_leaf_among_floats_is_passed_through_as_with_allow_int():
    """An integer leaf of a differentiated tree (a step counter in the params) is not
    differentiated: ``jax.grad(step, allow_int=True)`` gives what it gives for ``fn``, through
    fenced segments too, and a plain ``jax.grad(step)`` raises JAX's own error, as for ``fn``."""
    key = jax.random.PRNGKey(5)
    params = {"ws": [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(8)],
              "steps": jnp.arange(3)}
    x = jax.random.normal(key, (1024, 64))

    def fn(p, x):
        for w in p["ws"]:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2) * (1.0 + jnp.sum(p["steps"]).astype(jnp.float32))

    budget = int(remat_opt.peak_bytes(fn, params, x) * 0.8)
    step = remat_opt.optimize(fn, budget, cache=False)
    plan = step.plan(params, x)
    assert plan.measured_peak_bytes <= budget and not plan.schedule.plain
    got = jax.grad(step, allow_int=True)(params, x)
    want = jax.grad(fn, allow_int=True)(params, x)
    for g, r in zip(got["ws"], want["ws"]):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)
    assert got["steps"].dtype == want["steps"].dtype == jax.dtypes.float0
    with pytest.raises(TypeError, match="int"):
        jax.grad(step)(params, x)
    with pytest.raises(TypeError, match="int"):
        jax.grad(fn)(params, x)


def test_static_leaves_and_undifferentiated_integers_still_plan():
    """Equinox's filtered calls: a tree with static leaves passes its integer arrays through;
    an integer argument outside argnums is an input, as in jax.grad."""
    params = {"w": W, "act": jnp.tanh, "offset": jnp.arange(3), "scale": 2.0}

    def fn(p, x, n):
        return jnp.sum(p["act"](x @ p["w"]) * p["scale"]) + jnp.sum(p["offset"]) * n

    step = remat_opt.optimize(fn, "1GiB", cache=False)
    assert step.plan(params, X, jnp.int32(2)).schedule.plain
    got = jax.grad(lambda w: step({**params, "w": w}, X, jnp.int32(2)))(W)
    want = jax.grad(lambda w: fn({**params, "w": w}, X, jnp.int32(2)))(W)
    np.testing.assert_allclose(got, want, rtol=1e-6)


# --- What fn returns --------------------------------------------------------------------

@pytest.mark.parametrize("fn, has_aux, shown", [
    (lambda w, x: x @ w, False, "shape (4, 8)"),
    (lambda w, x: jnp.sum(x @ w, axis=0), False, "shape (8,)"),
    (lambda w, x: jnp.sum(x @ w).astype(jnp.complex64), False, "complex64"),
    (lambda w, x: jnp.sum(x @ w).astype(jnp.int32), False, "int32"),
    (lambda w, x: jnp.sum(x @ w) > 0, False, "bool"),
    (lambda w, x: (jnp.sum(x @ w), x), False, "has_aux=True"),
    (lambda w, x: {"loss": jnp.sum(x @ w)}, False, "one scalar loss"),
    (lambda w, x: jnp.sum(x @ w), True, "(loss, aux)"),
    (lambda w, x: (x @ w, 1.0), True, "shape (4, 8)"),
])
def test_loss_that_is_no_real_scalar_raises(fn, has_aux, shown):
    step = remat_opt.optimize(fn, "1GiB", has_aux=has_aux, cache=False)
    err = _raises(InvalidLossError, "fn", lambda: step.plan(W, X))
    assert shown in str(err)
    with pytest.raises(TypeError):  # jax.grad refuses the same function
        jax.grad(fn, has_aux=has_aux)(W, X)


# --- What fn closes over ----------------------------------------------------------------

def _optimized_under(transform):
    def outer(y):
        step = remat_opt.optimize(lambda w, x: loss(w, x) * y, "1GiB", cache=False)
        return step(W, X)

    return lambda: transform(outer)(jnp.ones(()) if transform is not jax.vmap else jnp.ones(2))


@pytest.mark.parametrize("transform", [jax.jit, jax.grad, jax.vmap], ids=["jit", "grad", "vmap"])
def test_closure_over_a_traced_value_raises(transform):
    err = _raises(ClosedOverTracerError, "fn", _optimized_under(transform))
    assert "pass the value to fn as an argument" in str(err)


def test_traced_value_passed_as_argument_plans():
    @jax.jit
    def outer(y):
        step = remat_opt.optimize(lambda w, x, y: loss(w, x) * y, "1GiB", cache=False)
        return jax.grad(step)(W, X, y)

    np.testing.assert_allclose(outer(2.0), jax.grad(lambda w: loss(w, X) * 2.0)(W), rtol=1e-6)


# --- Budgets ----------------------------------------------------------------------------

@pytest.mark.parametrize("budget, error", [
    (0, InvalidBudgetError),
    (-1, InvalidBudgetError),
    (np.int64(-5), InvalidBudgetError),
    (1.5, InvalidBudgetError),
    (float("nan"), InvalidBudgetError),
    (float("inf"), InvalidBudgetError),
    (-0.0, InvalidBudgetError),
    ("", InvalidBudgetError),
    ("lots", InvalidBudgetError),
    ("12 parsecs", InvalidBudgetError),
    ("-1GiB", InvalidBudgetError),
    ("0.1 B", InvalidBudgetError),
    ("1e-9 KiB", InvalidBudgetError),
    ("512M", InvalidBudgetError),
    (True, InvalidBudgetTypeError),
    (None, InvalidBudgetTypeError),
    ([1024], InvalidBudgetTypeError),
    (b"1024", InvalidBudgetTypeError),
    (1024j, InvalidBudgetTypeError),
    (jnp.int32(1024), InvalidBudgetTypeError),
])
def test_bad_budgets_raise(budget, error):
    err = _raises(error, "budget_bytes", lambda: remat_opt.optimize(loss, budget))
    assert repr(budget)[:20] in str(err) or str(budget) in str(err)


@pytest.mark.parametrize("fn, args, kwargs, error, named", [
    (lambda w: w * 2, (W,), {}, InvalidLossError, "fn"),
    (lambda w, x: loss(w, x), (W, X), {"argnums": 2}, InvalidArgnumsError, "argnums"),
    (lambda n, x: jnp.sum(x) * n, (3, X), {}, NonDifferentiableArgumentError, "args[0]"),
])
def test_peak_bytes_checks_its_call_as_optimize_does(fn, args, kwargs, error, named):
    _raises(error, named, lambda: remat_opt.peak_bytes(fn, *args, **kwargs))


@pytest.mark.parametrize("options, error, named", [
    ({"fn": 3}, InvalidOptionTypeError, "fn"),
    ({"max_attempts": 0}, InvalidOptionError, "max_attempts"),
    ({"unroll_scans": -1}, InvalidOptionError, "unroll_scans"),
    ({"cache": 123}, InvalidOptionTypeError, "cache"),
    ({"has_aux": "yes"}, InvalidOptionTypeError, "has_aux"),
    ({"xla_facts": 1}, InvalidOptionTypeError, "xla_facts"),
    ({"solver_options": {"time_limit_s": 1}}, InvalidOptionTypeError, "solver_options"),
    ({"interconnect": 100e9}, InvalidOptionTypeError, "interconnect"),
])
def test_bad_options_are_typed_errors_naming_the_option(options, error, named):
    options = {"fn": loss, **options}
    _raises(error, named, lambda: remat_opt.optimize(budget_bytes="1GiB", **options))


def test_a_wholly_integer_argument_beside_a_floating_one_passes_through():
    """``argnums=(0, 1)`` with an integer mask as argument 1: under ``allow_int`` its gradient is
    ``float0``, as for ``fn``; alone, an integer argument is still refused (nothing to plan)."""
    mask = (jnp.arange(8) % 2).astype(jnp.int32)

    def fn(w, mask, x):
        return jnp.sum(jnp.tanh(x @ w) * mask)

    step = remat_opt.optimize(fn, "1GiB", argnums=(0, 1), cache=False)
    got = jax.grad(step, argnums=(0, 1), allow_int=True)(W, mask, X)
    want = jax.grad(fn, argnums=(0, 1), allow_int=True)(W, mask, X)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert got[1].dtype == want[1].dtype == jax.dtypes.float0
    alone = remat_opt.optimize(fn, "1GiB", argnums=1, cache=False)
    _raises(NonDifferentiableArgumentError, "args[1]", lambda: alone.plan(W, mask, X))


def test_a_large_value_in_the_wrong_place_is_shown_briefly():
    """The params pytree passed as ``fn`` (a newcomer's slip) once made a 46 KB message: large
    values are shown by dtype and shape, and cut."""
    params = {f"layer{i}": {"w": jnp.ones((64, 64)), "b": jnp.zeros(64)} for i in range(40)}
    with pytest.raises(InvalidOptionTypeError) as info:
        remat_opt.optimize(params, "1MiB")
    message = str(info.value)
    assert message.startswith("fn must be callable; got {'layer0': {'b': float32[64], 'w': float32[64,64]}")
    assert len(message) < 500 and "characters)" in message and "Pass the loss function itself" in message
    assert info.value.value is params  # the value itself is kept whole on the error
    with pytest.raises(InvalidBudgetTypeError) as budget:
        remat_opt.optimize(lambda p: jnp.sum(p), np.ones((512, 512)))
    assert "float64[512,512]" in str(budget.value) and len(str(budget.value)) < 500
