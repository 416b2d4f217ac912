"""A scan body's saved values chosen by CP-SAT (solve/_body.py, planner/_loop_planning.body_plans).

The solver's choice is checked against exhaustive search over the same model,
and the plan it leads to against XLA, ``jax.grad`` and MaxText's recipes.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat_opt
from remat_opt.baselines import RECIPES, recipe_program
from remat_opt.memory import gradient_flops
from remat_opt.program import build_graph
from remat_opt.program._scan_body import scan_body
from remat_opt.program import trace
from remat_opt.rewrite import LoopPlan, loop_program, planned_scans
from remat_opt.program._trace import with_signature
from remat_opt.solve import choose_saved, saveable_nodes
from remat_opt.zoo import gpt


def small_scan_loss(ws, x):
    def body(h, w):
        a = jnp.tanh(h @ w)
        b = jnp.sin(a) * a
        c = jnp.tanh(b @ w) + h
        return c, None

    h, _ = lax.scan(body, x, ws)
    return jnp.sum(h ** 2)


def small_args():
    key = jax.random.key(0)
    return (jax.random.normal(key, (6, 16, 16)) * 0.3, jax.random.normal(jax.random.key(1), (8, 16)))


def body_graph():
    traced = trace(small_scan_loss, small_args(), {}, (0,))
    return build_graph(scan_body(traced, planned_scans(traced)[0]).program)


def brute_force(graph, cap: int) -> int:
    """Fewest FLOPs re-run over every saved subset whose bytes fit ``cap``."""
    saveable = sorted(saveable_nodes(graph))
    best = None
    for k in range(len(saveable) + 1):
        for subset in itertools.combinations(saveable, k):
            if sum(graph.node_bytes[n] for n in subset) > cap:
                continue
            saved, rerun, todo = set(subset), set(), [n for n, r in enumerate(graph.residual) if r]
            while todo:  # what the backward needs and has not saved: its equation re-runs
                n = todo.pop()
                if n in saved or graph.node_unit[n] in rerun:
                    continue
                rerun.add(graph.node_unit[n])
                todo.extend(graph.units[graph.node_unit[n]].inputs)
            flops = sum(graph.units[u].flops for u in rerun)
            best = flops if best is None else min(best, flops)
    return best


def test_choice_equals_exhaustive_search_at_every_cap():
    graph = body_graph()
    saveable = saveable_nodes(graph)
    assert 4 <= len(saveable) <= 14, len(saveable)
    sizes = sorted({graph.node_bytes[n] for n in saveable})
    total = sum(graph.node_bytes[n] for n in saveable)
    caps = [0, sizes[0], 2 * sizes[0] + 1, total // 2, total]
    flops = []
    for cap in caps:
        choice = choose_saved(graph, cap)
        assert choice.status == "OPTIMAL"
        assert choice.saved_bytes <= cap
        assert choice.recompute_flops == brute_force(graph, cap), cap
        flops.append(choice.recompute_flops)
    # Nothing saved re-runs the dots; everything saved re-runs only what JVP rules derive (cos, 1 - tanh^2).
    assert flops[0] > 10 * flops[-1]
    assert flops == sorted(flops, reverse=True)


def test_saved_names_run_as_a_loop_with_the_same_gradients():
    args = small_args()
    traced = trace(small_scan_loss, args, {}, (0,))
    graph = build_graph(scan_body(traced, planned_scans(traced)[0]).program)
    choice = choose_saved(graph, sum(graph.node_bytes) // 4)
    assert choice.saved
    program = with_signature(small_scan_loss, traced, loop_program(traced, LoopPlan(None, saved=choice.saved)))
    assert "scan" in str(jax.make_jaxpr(jax.grad(program))(*args))
    # atol: gradients reach 26; XLA orders the sums differently with the saved names (jax 0.12.1: 2.4e-6 apart).
    np.testing.assert_allclose(jax.grad(program)(*args), jax.grad(small_scan_loss)(*args), rtol=1e-5, atol=1e-5)


def test_a_loop_plan_has_a_policy_or_a_saved_set_not_both():
    with pytest.raises(ValueError, match="not both"):
        LoopPlan("dots_saveable", saved=("remat_opt/0/0",))


@pytest.fixture(scope="module")
def scanned_gpt():
    config = gpt.GPTConfig(num_layers=4, d_model=64, num_heads=4, seq_len=64, batch=2, vocab=64)
    params, batch = gpt.init(config, jax.random.key(0))
    params = gpt.stack_layers(params)
    base = gradient_flops(gpt.scan_loss, (params, batch), {}, 0)
    menu = {}
    for recipe in RECIPES:
        program = recipe_program(gpt.scan_loss, recipe)
        menu[recipe] = (remat_opt.peak_bytes(program, params, batch),
                        gradient_flops(program, (params, batch), {}, 0) - base)
    return params, batch, menu


def test_scanned_decoder_plan_beats_every_maxtext_recipe_that_fits(scanned_gpt):
    """Between the lightest and heaviest recipe, the body's saved set CP-SAT
    chose fits on XLA, keeps the loop, matches jax.grad, and recomputes no more
    than any recipe that fits, and less than the best of them."""
    params, batch, menu = scanned_gpt
    low, high = menu["full"][0], menu["minimal_with_context"][0]
    budget = (low + high) // 2
    step = remat_opt.optimize(gpt.scan_loss, budget, unroll_scans=0, cache=False)
    plan = step.plan(params, batch)
    assert plan.measured_peak_bytes <= budget
    assert plan.loop_plan is not None
    fitting = [flops for peak, flops in menu.values() if peak <= budget]
    assert fitting and plan.measured_recompute_flops <= min(fitting)
    assert plan.loop_plan.saved is not None, plan  # chosen by CP-SAT, not a built-in policy
    grads, want = jax.grad(step)(params, batch), jax.grad(gpt.scan_loss)(params, batch)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_the_lowest_recipe_peak_is_met_by_the_body_search(scanned_gpt):
    """At the lowest recipe peak the body's search finds a plan that fits, with no more
    recompute than the recipes that fit. Where XLA holds less for a saved set than for
    none (jax 0.10.2: MaxText's ``save_out_proj`` peaks below ``full``; jax 0.12.1, whose
    softmax is one ``custom_jvp``: it does not), saving nothing does not fit there, and the
    search must probe small sets to find one."""
    params, batch, menu = scanned_gpt
    low = min(peak for peak, _ in menu.values())
    step = remat_opt.optimize(gpt.scan_loss, low, unroll_scans=0, cache=False)
    plan = step.plan(params, batch)
    assert plan.measured_peak_bytes <= low, str(plan)
    assert plan.measured_recompute_flops <= min(flops for peak, flops in menu.values() if peak <= low), str(plan)
    if low < menu["full"][0]:
        assert plan.loop_plan is not None and plan.loop_plan.saved, str(plan)
    grads, want = jax.grad(step)(params, batch), jax.grad(gpt.scan_loss)(params, batch)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
