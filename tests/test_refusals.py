"""Refused budgets: the figure an InfeasibleBudgetError names is this program's, whatever ran
before; a budget under the step's arguments and outputs is refused before any search; and a
refusal is kept in the plan cache like a plan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt import InfeasibleBudgetError, format_bytes
from remat_opt.cache import _lowest
from remat_opt.planner import _optimize
from remat_opt._cli import main
from remat_opt.planner import floor_of
from remat_opt.memory import traced_step


def wide_mlp(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


def _wide():
    """Parameters and gradients dominate: 4 × 256×256 f32 (1 MiB) against an 8×256 batch."""
    key = jax.random.PRNGKey(1)
    params = [jax.random.normal(jax.random.fold_in(key, i), (256, 256)) / 16 for i in range(4)]
    return params, jax.random.normal(key, (8, 256))


def _tall():
    """Activations dominate: 6 × 64×64 weights against a 1024×64 batch."""
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(6)]
    return params, jax.random.normal(key, (1024, 64))


def _xla_arguments_and_outputs(fn, args, argnums=0, has_aux=False):
    m = traced_step(fn, args, {}, argnums, has_aux).lower().compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def _nbytes(tree):
    return sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree))


def _unused_and_aux(params, x, n):
    """An unused parameter (pruned by jit, a constant zero gradient) and aux returning an input as is."""
    h = jnp.tanh(x @ params["w"]) * n
    return jnp.sum(h**2), {"x": x, "h": h}


@pytest.mark.parametrize("case", ["wide", "tall", "unused_and_aux"])
def test_the_floor_is_under_xla_arguments_and_outputs(case):
    """The floor (remat_opt.planner._floor) never exceeds XLA's argument + output bytes of the plain step,
    which every plan's step has too; and it holds the differentiated parameters and their gradients."""
    if case == "unused_and_aux":
        key = jax.random.PRNGKey(2)
        params = {"w": jax.random.normal(key, (128, 128)), "unused": jnp.ones((512, 512))}
        fn, args, has_aux = _unused_and_aux, (params, jnp.ones((16, 128)), jnp.int32(3)), True
        differentiated = params["w"]  # the unused one is neither read nor given a computed gradient
    else:
        fn, args, has_aux = wide_mlp, (_wide() if case == "wide" else _tall()), False
        differentiated = args[0]
    floor = floor_of(traced_step(fn, args, {}, 0, has_aux).jaxpr.jaxpr)
    assert 2 * _nbytes(differentiated) <= floor.total <= _xla_arguments_and_outputs(fn, args, has_aux=has_aux)


def test_a_budget_under_parameters_and_gradients_is_refused_before_any_search(monkeypatch):
    params, x = _wide()
    floor = floor_of(traced_step(wide_mlp, (params, x), {}, 0, False).jaxpr.jaxpr).total

    def searched(*args, **kwargs):
        raise AssertionError("a budget under the arguments and outputs was searched")

    monkeypatch.setattr(_optimize, "program_model", searched)  # the planned program's model, the search's start
    budget = int(2 * _nbytes(params) * 0.9)  # the newcomer's: under parameters + gradients
    with pytest.raises(InfeasibleBudgetError) as info:
        remat_opt.optimize(wide_mlp, budget).plan(params, x)
    err = info.value
    assert err.lower_bound and err.min_budget_bytes == floor and err.budget_bytes == budget
    assert "parameters, inputs, gradients and loss outputs" in str(err) and "peak_bytes" in str(err)
    # At the floor itself the search runs (here: our stand-in's error), so the floor refuses nothing above it.
    with pytest.raises(AssertionError, match="searched"):
        remat_opt.optimize(wide_mlp, floor, cache=False).plan(params, x)


def _program_keys_of_refusal(fn, budget, args):
    """The refusal at ``budget`` with nothing earlier in the process, and the program keys it kept."""
    before = set(_lowest._lowest)
    with pytest.raises(InfeasibleBudgetError) as info:
        remat_opt.optimize(fn, budget, cache=False).plan(*args)
    return info.value, set(_lowest._lowest) - before


def test_the_figure_named_does_not_depend_on_what_ran_before():
    """The figure is this search's lowest measured peak. An earlier plan of the program that
    measured lower (what a 0.6x plan leaves in the process before a 0.4x refusal) is said beside
    it, never named as the figure: the same refusal alone and after it names the same bytes."""
    params, x = _tall()
    budget = 600_000  # above the floor (about 448 KiB), under every plan's peak
    alone, keys = _program_keys_of_refusal(wide_mlp, budget, (params, x))
    assert not alone.lower_bound and budget < alone.min_budget_bytes and len(keys) == 1
    (key,) = keys
    try:
        earlier = alone.min_budget_bytes - 50_000  # still over the budget: recalled, measured, not a plan
        _lowest._lowest[key] = (earlier, _lowest._lowest[key][1])
        with pytest.raises(InfeasibleBudgetError) as after:
            remat_opt.optimize(wide_mlp, budget, cache=False).plan(params, x)
    finally:
        _lowest._lowest.pop(key, None)
    assert after.value.min_budget_bytes == alone.min_budget_bytes
    assert f"An earlier plan of this program measured {earlier:,} bytes" in str(after.value)
    assert str(alone).startswith(str(after.value).split(" (")[0])


def test_a_refusal_is_kept_in_the_plan_cache(tmp_path, monkeypatch, capsys):
    """A later process (here: the process's memory cleared) with the cache warm is refused at
    once, with the same figure, without planning."""
    params, x = _tall()
    budget = 600_000
    with pytest.raises(InfeasibleBudgetError) as first:
        remat_opt.optimize(wide_mlp, budget, cache=tmp_path).plan(params, x)
    monkeypatch.setattr(_lowest, "_lowest", {})

    def planned(*args, **kwargs):
        raise AssertionError("planned again")

    monkeypatch.setattr(_optimize.OptimizedFunction, "_make_plan", planned)
    with pytest.raises(InfeasibleBudgetError) as again:
        remat_opt.optimize(wide_mlp, budget, cache=tmp_path).plan(params, x)
    assert (again.value.min_budget_bytes, again.value.budget_bytes) == (first.value.min_budget_bytes, budget)
    assert again.value.schedule == first.value.schedule and "remembered by the plan cache" in str(again.value)
    main(["cache", "list", "--dir", str(tmp_path)])  # listed as a refusal, with its figure
    assert f"refused, lowest {format_bytes(first.value.min_budget_bytes)}" in capsys.readouterr().out
    # Another budget is another question: it is planned.
    with pytest.raises(AssertionError, match="planned again"):
        remat_opt.optimize(wide_mlp, budget + 1, cache=tmp_path).plan(params, x)
