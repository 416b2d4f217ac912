"""Budgets below reach: the InfeasibleBudgetError names a budget that is then planned, in the same
process and in a later one through the plan cache, and the lowest peak measured is the one kept.

Split from tests/test_optimize.py, whose plans of the small GPT take as long as these: in two
files, pytest-xdist (``--dist loadfile``) runs them on its two workers at once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import InfeasibleBudgetError, Schedule, peak_bytes
from remat_opt.cache import _lowest


def max_abs_diff(a, b):
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in pairs)


def test_infeasible_budget_names_a_feasible_one(small_mlp):
    fn, params, x = small_mlp
    step = remat_opt.optimize(fn, 1024)
    with pytest.raises(InfeasibleBudgetError) as info:
        step.plan(params, x)
    assert info.value.lower_bound  # under the step's arguments and outputs: refused before a search
    floor = info.value.min_budget_bytes
    with pytest.raises(InfeasibleBudgetError) as info:
        remat_opt.optimize(fn, floor).plan(params, x)
    feasible = info.value.min_budget_bytes
    assert feasible > 1024 and "budget_bytes" in str(info.value) and not info.value.lower_bound
    plan = remat_opt.optimize(fn, feasible).plan(params, x)
    assert plan.measured_peak_bytes <= feasible


def _small_convnet():
    """Two residual convolution pairs, each followed by 2×2 average pooling: a program whose
    peak the model puts far under XLA's (about 40%), so the schedules a search measures move with its budget."""
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def pool(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0

    def loss(params, x, labels):
        h = jax.nn.relu(conv(x, params["c0"]))
        h = pool(jax.nn.relu(conv(h, params["c1"])) + h)
        h = jax.nn.relu(conv(h, params["c2"]))
        h = pool(jax.nn.relu(conv(h, params["c3"])) + h)
        logits = h.mean((1, 2)) @ params["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    keys = jax.random.split(jax.random.PRNGKey(11), 7)
    shapes = {"c0": (3, 3, 3, 32), "c1": (3, 3, 32, 32), "c2": (3, 3, 32, 32), "c3": (3, 3, 32, 32), "head": (32, 10)}
    params = {k: jax.random.normal(key, s) / np.sqrt(np.prod(s[:-1])) for key, (k, s) in zip(keys, shapes.items())}
    return loss, params, jax.random.normal(keys[5], (8, 32, 32, 3)), jax.random.randint(keys[6], (8,), 0, 10)


def test_the_budget_an_error_names_is_planned(tmp_path):
    """An InfeasibleBudgetError says which budget works; planning the same program at it (or
    above) must find a plan, though its search measures other schedules than the refused one's:
    in the same process, and in a later one through the plan cache."""
    fn, params, x, labels = _small_convnet()
    plain = peak_bytes(fn, params, x, labels)
    earlier = remat_opt.optimize(fn, int(plain * 0.8), cache=False).plan(params, x, labels)
    budget = int(plain * 0.5)
    with pytest.raises(InfeasibleBudgetError) as info:
        remat_opt.optimize(fn, budget, cache=tmp_path).plan(params, x, labels)
    named = info.value.min_budget_bytes
    assert named <= earlier.measured_peak_bytes  # this search measured lower than the plan at 0.8 did
    assert info.value.__cause__ is None and (info.value.__context__ is None or info.value.__suppress_context__)  # one minimum shown
    plan = remat_opt.optimize(fn, named, cache=False).plan(params, x, labels)
    assert plan.measured_peak_bytes <= named
    _lowest._lowest.clear()  # what a new process knows: the plan cache
    step = remat_opt.optimize(fn, int(named * 1.02), cache=tmp_path)
    assert step.plan(params, x, labels).measured_peak_bytes <= int(named * 1.02)
    assert max_abs_diff(jax.grad(step)(params, x, labels), jax.grad(fn)(params, x, labels)) < 1e-5


def test_the_lowest_kept_is_the_lowest_measured_and_reaches_the_cache(tmp_path):
    """remat_opt.cache._lowest keeps, per program, the lowest peak measured (from a returned plan or
    an error); the plan cache gets it when an error names it, never a higher one over it."""
    key = "program-for-test-of-lowest"
    low, high = Schedule(cuts=frozenset({3})), Schedule(cuts=frozenset({5}))
    try:
        _lowest.remember(key, 1000, low, None, "f")  # a returned plan: this process only
        assert _lowest.lowest_kept(key, tmp_path) == (1000, low) and not list(tmp_path.glob("*.json"))
        _lowest.remember(key, 2000, high, tmp_path, "f")  # an error's, higher: the kept one is written
        assert _lowest.lowest_kept(key, None) == (1000, low)
        _lowest._lowest.clear()  # a new process reads the cache
        assert _lowest.lowest_kept(key, tmp_path) == (1000, low)
        assert _lowest.recall(key, 999, tmp_path) is None and _lowest.recall(key, 1000, tmp_path) == low
    finally:
        _lowest._lowest.pop(key, None)
