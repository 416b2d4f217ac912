"""A scan body's own baselines: every MaxText name recipe and every JAX built-in policy on it.

The planner promises that a budget is refused only below every baseline, and that no baseline
that fits recomputes less than its plan. On a scanned decoder whose projections carry MaxText's
``checkpoint_name``s, the baselines a user writes on the scan body are MaxText's recipes
(``save_only_these_names`` over those names) and ``jax.checkpoint`` with a built-in policy.
Each is written here as a user writes it (``jax.checkpoint`` on the body function): the
planner's own loop plans must include it, as the same program; and asked for at the peak of the
recipe CP-SAT's saved sets missed, ``optimize`` must fit with no more recomputed FLOPs, at two depths.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import remat_opt
from remat_opt.baselines import RECIPES
from remat_opt.memory import gradient_flops
from remat_opt.program._trace import trace, with_signature
from remat_opt.rewrite import (LoopPlan, loop_candidates, loop_program, recipe_candidates, scan_lengths,
                                     user_names)
from remat_opt.rewrite import POLICIES

WIDTH, TOKENS = 32, 128
SOLVER = remat_opt.SolverOptions(deterministic_time_limit=0.5, num_workers=2)


def init(layers: int) -> tuple:
    """Stacked weights of ``layers`` decoder layers (width 32, MLP 4×) and a batch of 4 sequences."""
    keys = jax.random.split(jax.random.key(0), 7)
    shapes = {"wq": (WIDTH, WIDTH), "wk": (WIDTH, WIDTH), "wv": (WIDTH, WIDTH), "wo": (WIDTH, WIDTH),
              "wi": (WIDTH, 4 * WIDTH), "wf": (4 * WIDTH, WIDTH)}
    stack = {name: jax.random.normal(k, (layers, *shape)) * shape[0] ** -0.5
             for k, (name, shape) in zip(keys, shapes.items())}
    return stack, jax.random.normal(keys[-1], (4, TOKENS // 4, WIDTH))


def norm(x: jax.Array) -> jax.Array:
    return x / (1e-5 + jnp.sqrt(jnp.mean(x * x, -1, keepdims=True)))


def layer(p: dict, x: jax.Array) -> jax.Array:
    """A pre-norm decoder layer, its projections named as MaxText names them."""
    h = norm(x)
    q = checkpoint_name(h @ p["wq"], "query_proj")
    k = checkpoint_name(h @ p["wk"], "key_proj")
    v = checkpoint_name(h @ p["wv"], "value_proj")
    scores = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / WIDTH ** 0.5, axis=-1)
    context = checkpoint_name(jnp.einsum("bqk,bkd->bqd", scores, v), "context")
    x = x + checkpoint_name(context @ p["wo"], "out_proj")
    up = checkpoint_name(jax.nn.gelu(norm(x) @ p["wi"]), "mlpwi")
    return x + checkpoint_name(up @ p["wf"], "mlpwo")


def loss(stack: dict, x: jax.Array, body_policy=None) -> jax.Array:
    body = lambda h, p: (layer(p, h), None)  # noqa: E731
    if body_policy is not None:
        body = jax.checkpoint(body, policy=body_policy)
    h, _ = lax.scan(body, x, stack)
    return jnp.mean(h ** 2)


def body_policies() -> dict[str, object]:
    """Every recipe and built-in policy a user can put on the body, by name."""
    policies = {f"recipe {r}": jax.checkpoint_policies.save_only_these_names(*names) for r, names in RECIPES.items()}
    policies.update({f"policy {p}": policy for p, policy in POLICIES.items()})
    return policies


def written(policy) -> object:
    """The loss with ``policy`` on its scan body, as a user writes it."""
    return lambda s, x: loss(s, x, body_policy=policy)


def test_every_recipe_and_policy_on_the_body_is_a_loop_plan_the_planner_measures():
    """The loop plans the planner measures (``loop_plans``) include each recipe on the names the body carries and each built-in policy on the body, each
    the program the user writes: the same recomputed FLOPs, and (checked on ``save_out_proj``) the
    same XLA peak. So none of them can fit where the planner refuses, or recompute less than the
    plan it returns."""
    stack, x = init(2)
    whole = trace(loss, (stack, x), {}, (0,))
    family = {*loop_candidates(scan_lengths(whole)), *recipe_candidates(user_names(whole))}
    base = gradient_flops(loss, (stack, x), {}, 0)
    for name, policy in body_policies().items():
        kind, which = name.split(" ")
        if which == "everything_saveable":
            continue  # the program as written, measured first of all
        if kind == "policy" or not RECIPES[which]:  # (a recipe saving no names is nothing_saveable)
            loop = LoopPlan(which if kind == "policy" else "nothing_saveable")
        else:
            loop = LoopPlan(None, names=RECIPES[which])
        assert loop in family, name
        program = with_signature(loss, whole, loop_program(whole, loop))
        flops = gradient_flops(program, (stack, x), {}, 0) - base
        assert flops == gradient_flops(written(policy), (stack, x), {}, 0) - base, name
        if which == "save_out_proj":
            assert remat_opt.peak_bytes(program, stack, x) == remat_opt.peak_bytes(written(policy), stack, x)


@pytest.mark.parametrize("layers", [4, 8])
def test_at_a_recipes_peak_the_plan_recomputes_no_more(layers, tmp_path):
    """At the peak of MaxText's ``save_out_proj`` on the body (a set with which XLA holds
    little more than saving nothing), the plan fits, as a loop, with no more recomputed FLOPs
    than the recipe, and ``jax.grad``'s gradients. Before the recipes were among the loop plans
    measured, CP-SAT's saved sets missed it and recomputed more there; on a deeper model, the
    budget was refused."""
    stack, x = init(layers)
    recipe = written(body_policies()["recipe save_out_proj"])
    budget = remat_opt.peak_bytes(recipe, stack, x)
    flops = gradient_flops(recipe, (stack, x), {}, 0) - gradient_flops(loss, (stack, x), {}, 0)
    step = remat_opt.optimize(loss, budget, unroll_scans=0, cache=tmp_path, solver_options=SOLVER)
    plan = step.plan(stack, x)
    assert plan.measured_peak_bytes <= budget, str(plan)
    assert plan.loop_plan is not None and plan.measured_recompute_flops <= flops, (str(plan), flops)
    # Kept in the plan cache and loaded by another optimize: the same loop plan (a recipe's names too).
    loaded = remat_opt.optimize(loss, budget, unroll_scans=0, cache=tmp_path, solver_options=SOLVER).plan(stack, x)
    assert loaded.loop_plan == plan.loop_plan and loaded.measured_peak_bytes == plan.measured_peak_bytes
    want = jax.grad(loss)(stack, x)
    for g, w in zip(jax.tree.leaves(jax.grad(step)(stack, x)), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
