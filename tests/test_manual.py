"""A model written as one ``shard_map``: its body planned per device (program/_manual.py).

These run on a one-device mesh in the test process (``tests/test_spmd.py`` runs the same
machinery on 8 simulated devices, in a process of its own): the body is traced inside its
call, its graph is built on per-device values, and a plan rewrites it inside the same
``shard_map``; XLA fits it and ``jax.grad`` agrees. Also the one-pass count of collective
bytes, on HLO text written by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import remat_opt
from remat_opt.memory._sharded import collective_bytes
from remat_opt.program import build_graph
from remat_opt.program._manual import planned_body
from remat_opt.program import trace
from remat_opt.rewrite import LoopPlan

try:  # jax >= 0.7
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

WIDTH, DEPTH, BATCH = 64, 4, 256


def block(p, x):
    """A Megatron MLP block, per device: ``x + psum(gelu(x @ w1 + b1) @ w2)``."""
    return x + jax.lax.psum(jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"], "model")


def mesh_of_one() -> jax.sharding.Mesh:
    return jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def model_loss(mesh):
    specs = [{"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}] * DEPTH

    def per_device(params, x):
        for p in params:
            x = block(p, x)
        return x

    model = shard_map(per_device, mesh=mesh, in_specs=(specs, P("data")), out_specs=P("data"))

    def loss(params, batch):
        return jnp.mean(jnp.square(model(params, batch["x"]) - batch["y"]))

    return loss


@pytest.fixture(scope="module")
def program():
    mesh = mesh_of_one()
    k = jax.random.split(jax.random.key(0), 2 * DEPTH + 2)
    params = [{"w1": jax.random.normal(k[2 * i], (WIDTH, 4 * WIDTH)) / 8, "b1": jnp.zeros(4 * WIDTH),
               "w2": jax.random.normal(k[2 * i + 1], (4 * WIDTH, WIDTH)) / 32} for i in range(DEPTH)]
    batch = {"x": jax.random.normal(k[-2], (BATCH, WIDTH)), "y": jax.random.normal(k[-1], (BATCH, WIDTH))}
    return model_loss(mesh), params, batch


def test_the_body_is_planned_in_place_of_the_program(program):
    loss, params, batch = program
    traced = trace(loss, (params, batch), {}, (0,))
    body = planned_body(traced)
    assert body is not None and body.manual is not None
    names = [e.primitive.name for e in body.jaxpr.jaxpr.eqns]
    assert names.count("dot_general") == 2 * DEPTH and names[-1] == "copy"  # each output leaves through a copy
    assert body.differentiable == (True,) * (3 * DEPTH) + (False,)  # the weights, not the batch
    graph = build_graph(body)  # linearized inside the call: its psum's axis is bound there
    assert graph.num_positions == len(names)
    # The type casts JAX adds inside a shard_map are views: no buffer of their own.
    assert all(graph.buffer[u.outputs[0]] != u.outputs[0] for u in graph.units if u.primitive == "pvary")


def test_a_program_of_one_layer_per_call_is_planned_between_calls():
    mesh = mesh_of_one()
    layer = shard_map(block, mesh=mesh, in_specs=({"w1": P(None, "model"), "b1": P("model"),
                                                   "w2": P("model", None)}, P("data")), out_specs=P("data"))

    def loss(params, x):
        for p in params:
            x = layer(p, x)
        return jnp.sum(x)

    params = [{"w1": jnp.ones((8, 32)), "b1": jnp.zeros(32), "w2": jnp.ones((32, 8))}] * 2
    assert planned_body(trace(loss, (params, jnp.ones((4, 8))), {}, (0,))) is None


def test_plans_fit_keep_the_gradients_and_are_kept_and_loaded(program, tmp_path):
    # One plan (the cache folder is empty, so it is solved afresh), then loaded from the cache.
    loss, params, batch = program
    plain = remat_opt.peak_bytes(loss, params, batch)
    want = jax.grad(loss)(params, batch)
    budget = int(0.75 * plain)
    options = remat_opt.SolverOptions(deterministic_time_limit=0.5, num_workers=2)
    made_step = remat_opt.optimize(loss, budget, cache=tmp_path, solver_options=options)
    made = made_step.plan(params, batch)
    assert made.measured_peak_bytes <= budget
    assert remat_opt.peak_bytes(made_step, params, batch) == made.measured_peak_bytes
    got = jax.jit(jax.grad(made_step))(params, batch)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)

    step = remat_opt.optimize(loss, budget, cache=tmp_path, solver_options=options)
    loaded = step.plan(params, batch)
    assert (loaded.schedule, loaded.loop_plan, loaded.measured_peak_bytes) == (
        made.schedule, made.loop_plan, made.measured_peak_bytes)
    assert remat_opt.peak_bytes(step, params, batch) == made.measured_peak_bytes  # the body rebuilt


def test_a_body_plan_says_it_is_one():
    assert str(LoopPlan(None, saved=("a", "b"), body="shard_map")) == "shard_map body per device saving 2 named values"


HLO = """HloModule fenced

%branch_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %r = f32[4]{0} all-reduce(%p), channel_id=1, to_apply=%add
}

%branch_b (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %s = f32[4]{0} all-reduce(%q), channel_id=2, to_apply=%add
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %z = f32[] add(%x, %y)
}

ENTRY %main (a: f32[4], c: pred[]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %c = pred[] parameter(1)
  %g = f32[4]{0} all-gather(%a), channel_id=3, dimensions={0}
  ROOT %k = f32[4]{0} conditional(%c, %g, %g), true_computation=%branch_a, false_computation=%branch_b
}
"""


def test_collective_bytes_count_one_branch_of_a_conditional():
    # The gather (16 bytes) and one branch's all-reduce (16), not both branches'.
    assert collective_bytes(HLO) == 32
    indexed = HLO.replace("true_computation=%branch_a, false_computation=%branch_b",
                          "branch_computations={%branch_a, %branch_b}")
    assert collective_bytes(indexed) == 32
