"""What each layer saves, chosen by time: the roofline price, the layers of a ResNet, the CP-SAT
choice against brute force, and the plans' gradients.

Whether these plans are faster on the device than the one-line policies is measured on a TPU by
experiments/step_time.py (docs/measurements.md); here, on the CPU, the parts that can be checked
exactly.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt.program import FlopCostModel, build_graph
from remat_opt.program._roofline import RooflineCostModel, bytes_moved
from remat_opt.program._trace import trace, with_signature
from remat_opt.rewrite import LayerPlan, layer_program
from remat_opt.rewrite import recipe_candidates, user_names
from remat_opt.solve import save_candidates
from remat_opt.solve import Layers, layers_of
from remat_opt.solve._stage_saves import layer_names, layer_saves, layer_stages, recomputed_units, saveable
from remat_opt.zoo import MODELS, ResNetConfig


def test_the_roofline_prices_memory_bound_work_by_its_bytes_and_matmuls_by_their_flops():
    big = jnp.ones((256, 256))
    exp = jax.make_jaxpr(jnp.exp)(big).eqns[0]
    dot = jax.make_jaxpr(jnp.matmul)(big, big).eqns[0]
    model = RooflineCostModel(ridge=20.0)
    assert bytes_moved(exp) == 256 * 256 * 4  # an elementwise equation writes its output
    assert model.eqn_flops(exp) == 20 * 256 * 256 * 4  # far above its 65,536 FLOPs
    assert model.eqn_flops(dot) == 2 * 256**3  # 33.5 MFLOPs, above 20 x 786,432 bytes
    assert RooflineCostModel(ridge=100.0).eqn_flops(dot) == 100 * 3 * 256 * 256 * 4  # now bound by its bytes
    # Run again in the backward, elementwise work joins the fusion that reads it: its FLOPs alone.
    rerun = RooflineCostModel(ridge=20.0, rerun=True)
    assert bytes_moved(exp, rerun=True) == 0 and rerun.eqn_flops(exp) == FlopCostModel().eqn_flops(exp) < 20 * 256**2
    assert rerun.eqn_flops(dot) == model.eqn_flops(dot)  # a matmul reads and writes either way
    with pytest.raises(ValueError, match="ridge"):
        RooflineCostModel(ridge=0)


def test_the_layers_of_a_resnet_are_its_blocks_those_that_downsample_and_those_that_do_not():
    config = ResNetConfig(image_size=16, widths=(8, 16, 32), blocks_per_stage=2, batch=2)
    spec = MODELS["resnet"]
    params, batch = spec.init(config, jax.random.key(0))
    layers = layers_of(trace(spec.loss, (params, batch), {}, (0,)))
    assert layers is not None and layers.count == 6  # 3 stages of 2 blocks; 2 of the 3 first blocks downsample
    lengths = [hi - lo for lo, hi in layers.spans()]
    assert lengths[0] == lengths[1] == lengths[3] == lengths[5] < lengths[2] == lengths[4]


def mlp(params, x):
    for w1, w2 in params:
        x = x + jnp.tanh(jnp.exp(jnp.sin(x @ w1)) @ w2)
    return jnp.sum(x**2)


@pytest.fixture(scope="module")
def mlp_graph():
    keys = jax.random.split(jax.random.key(0), 6)
    params = [(jax.random.normal(keys[2 * k], (16, 32)) / 4, jax.random.normal(keys[2 * k + 1], (32, 16)) / 6)
              for k in range(3)]
    args = (params, jax.random.normal(keys[-1], (64, 16)))
    traced = trace(mlp, args, {}, (0,))
    return args, traced, build_graph(traced, RooflineCostModel(ridge=8.0)), layers_of(traced)


def _recompute_cost(graph, stages, saved):
    """What the layers recompute saving ``saved``: each layer's residuals it does not save, and the
    inputs made in the layer of what it recomputes, recursively; summed unit costs."""
    total = 0
    for stage in stages:
        roots = [v for u in stage.units for v in graph.units[u].outputs
                 if graph.residual[v] and v not in stage.exits and v not in saved]
        stack, done = [graph.node_unit[v] for v in roots], set()
        while stack:
            u = stack.pop()
            if u in done:
                continue
            done.add(u)
            stack += [graph.node_unit[w] for w in graph.units[u].inputs
                      if stage.lo <= graph.position_of(w) < stage.hi and w not in stage.exits and w not in saved]
        total += sum(graph.units[u].flops for u in done if u in graph.primal)
    return total


@pytest.mark.parametrize("priced", [False, True])
def test_each_layers_saves_cost_the_least_for_the_bytes_they_take_as_brute_force_finds(mlp_graph, priced):
    """Each layer's saved set: under the cap all layers share, and no other set of that layer, in
    no more bytes, costs less (its recompute, plus, when ``priced``, what keeping its values
    costs); a larger cap never costs more."""
    _, _, graph, layers = mlp_graph
    two = Layers(layers.cuts[:3], layers.size)  # two layers: 2^k subsets stay few
    stages = layer_stages(graph, two)
    store = {v: 3 * graph.node_bytes[v] * 8 for v in save_candidates(graph)} if priced else {}

    def nbytes(subset):
        return sum(graph.node_bytes[b] for b in {graph.buffer[v] for v in subset})

    def cost(stage, subset):
        kept = {}
        for v in subset:
            kept[graph.buffer[v]] = max(kept.get(graph.buffer[v], 0), store.get(v, 0))
        return _recompute_cost(graph, [stage], set(subset)) + sum(kept.values())

    own = [saveable(graph, {v for u in s.units for v in graph.units[u].outputs}, s.exits, save_candidates(graph))
           for s in stages]
    assert all(3 <= len(c) <= 14 for c in own)
    total = nbytes([v for c in own for v in c])
    caps = [0, total // 4, total // 2, total]
    found = layer_saves(graph, two, caps, store=store or None)
    costs = []
    for cap, saved in zip(caps, found):
        assert saved is not None and nbytes(saved) <= cap
        costs.append(0)
        for stage, candidates in zip(stages, own):
            mine = [v for v in saved if v in candidates]
            best = min(cost(stage, subset) for r in range(len(candidates) + 1)
                       for subset in itertools.combinations(candidates, r) if nbytes(subset) <= nbytes(mine))
            assert cost(stage, mine) == best
            costs[-1] += best
    assert costs == sorted(costs, reverse=True) and costs[-1] < costs[0]
    if priced:  # keeping a value costs more than recomputing a cheap one: not every byte is spent
        assert nbytes(found[-1]) < nbytes(found[-1] | set(own[0]) | set(own[1]))


def test_a_layers_recomputed_units_are_the_least_its_saved_set_allows(mlp_graph):
    _, _, graph, layers = mlp_graph
    stage = layer_stages(graph, layers)[1]
    candidates = saveable(graph, {v for u in stage.units for v in graph.units[u].outputs}, stage.exits,
                          save_candidates(graph))
    for r in (0, 1, len(candidates)):
        saved = set(candidates[:r])
        got = recomputed_units(graph, stage, saved)
        assert sum(graph.units[u].flops for u in got if u in graph.primal) == _recompute_cost(graph, [stage], saved)
    assert recomputed_units(graph, stage, set()) > recomputed_units(graph, stage, set(candidates))


@pytest.mark.parametrize("fenced", [False, True])
def test_layers_saving_their_chosen_values_have_the_programs_gradients(mlp_graph, fenced):
    args, traced, graph, layers = mlp_graph
    total = sum(graph.node_bytes[v] for v in save_candidates(graph))
    saved = layer_saves(graph, layers, [total // 3])[0]
    names = layer_names(graph, layers, saved)
    assert saved and sum(map(len, names)) == len(saved)
    policies = [None] * (len(layers.bounds()) - 1)
    for stage, chosen in zip(layers.layer_stages(), names):
        policies[stage] = chosen
    plan = LayerPlan(layers.bounds(), tuple(policies), fenced)
    program = with_signature(mlp, traced, layer_program(traced, plan))
    got, want = jax.jit(jax.grad(program))(*args), jax.jit(jax.grad(mlp))(*args)
    assert all(np.allclose(g, w, rtol=1e-5, atol=1e-4) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    assert "chosen values" in str(plan)
    assert remat_opt.peak_bytes(program, *args) > 0


def test_a_scanned_model_gets_its_body_saving_what_the_time_model_chose():
    from remat_opt.zoo import GPTConfig
    from remat_opt.zoo.gpt import scan_loss, stack_layers

    config = GPTConfig(num_layers=3, d_model=64, num_heads=2, seq_len=64, batch=2, vocab=128)
    params, batch = MODELS["gpt"].init(config, jax.random.key(0))
    args = (stack_layers(params), batch)
    assert layers_of(trace(scan_loss, args, {}, (0,))) is None  # no layers beside the scan: no per-layer candidates
    budget = remat_opt.peak_bytes(scan_loss, *args) // 2
    step = remat_opt.optimize(scan_loss, budget, objective="time", cache=False)
    plan = step.plan(*args)
    assert plan.fits and not any(t.label.startswith("every layer") for t in plan.timed)
    assert any("chosen by time" in t.label and "an iteration" in t.label for t in plan.timed)
    # The body carries MaxText's names: each recipe a user of them can write is measured beside the policies.
    recipes = {str(p) for p in recipe_candidates(user_names(trace(scan_loss, args, {}, (0,))))}
    assert len(recipes) >= 5 and recipes <= {t.label for t in plan.timed}
    got, want = jax.jit(jax.grad(step))(*args), jax.jit(jax.grad(scan_loss))(*args)
    assert all(np.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
