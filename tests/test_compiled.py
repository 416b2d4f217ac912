"""Facts read off XLA's compiled program: the buffers it carries into the backward,
and the model's use of them for primitives no rule names."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

import remat_opt
from remat_opt._schedule import Schedule
from remat_opt.memory import simulate
from remat_opt.memory._facts import read_plain, unknown_primitives, with_memory_facts
from remat_opt.memory._fusion import UnknownPrimitiveWarning
from remat_opt.program import build_graph, trace


def _elementwise(name, fn):
    p = Primitive(name)
    p.def_impl(fn)
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    mlir.register_lowering(p, mlir.lower_fun(fn, multiple_results=False))
    return p


# A tanh whose JVP reads 1 - y² through a primitive of its own, as jax 0.12's
# tanh does (``one_minus_square``): primitives no rule of the model names.
_oms = _elementwise("test_one_minus_square", lambda y: 1 - y * y)
ad.defjvp(_oms, lambda t, y: -2 * y * t)
_tanh = _elementwise("test_tanh", jnp.tanh)


def _tanh_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = _tanh.bind(x)
    return y, t * _oms.bind(y)


ad.primitive_jvps[_tanh] = _tanh_jvp


def custom_mlp(params, x):
    for w in params:
        x = _tanh.bind(x @ w)
    return jnp.mean(x**2)


def plain_mlp(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


@pytest.fixture(scope="module")
def mlp_args():
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (128, 128)) / 12 for i in range(6)]
    return params, jax.random.normal(key, (512, 128))


def test_held_buffers_are_one_activation_per_layer(mlp_args):
    # What the backward of tanh(x @ w) needs from each layer is its output (for
    # the tanh JVP and the next layer's weight gradient): XLA carries exactly
    # one activation per layer, each named after the tanh's equation.
    params, x = mlp_args
    traced = trace(plain_mlp, (params, x), {}, (0,))
    compiled = read_plain(plain_mlp, traced, (params, x), {}, 0)
    tanh_eqns = [i for i, e in enumerate(traced.jaxpr.jaxpr.eqns) if e.primitive.name == "tanh"]
    activations = [b for b in compiled.held if b.bytes == x.size * 4]
    assert sorted(b.eqn for b in activations if b.eqn >= 0) == tanh_eqns
    assert all(b.primitive == "tanh" for b in activations)
    assert compiled.peak_bytes == remat_opt.peak_bytes(plain_mlp, params, x)


def test_unknown_primitives_take_xla_decision(mlp_args):
    params, x = mlp_args
    traced = trace(custom_mlp, (params, x), {}, (0,))
    graph = build_graph(traced)
    assert unknown_primitives(graph) == ("test_one_minus_square", "test_tanh")
    compiled = read_plain(custom_mlp, traced, (params, x), {}, 0)
    facts = with_memory_facts(graph, compiled)
    oms = [v for v in range(graph.num_nodes) if graph.units[graph.node_unit[v]].primitive == "test_one_minus_square"]
    tanh = [v for v in range(graph.num_nodes) if graph.units[graph.node_unit[v]].primitive == "test_tanh"]
    # XLA recomputes 1 - y² inside the backward's fusions and holds y.
    assert all(graph.residual[v] and facts.fused[v] for v in oms)
    assert all(not facts.fused[v] for v in tanh)
    plain = compiled.peak_bytes
    guessed = simulate(with_memory_facts(graph), Schedule(plain=True)).peak_bytes
    read = simulate(facts, Schedule(plain=True)).peak_bytes
    assert abs(read / plain - 1) < 0.1  # uncalibrated
    assert guessed / plain - 1 > 0.3  # the guess holds both y and 1 - y² per layer


def test_optimize_warns_only_when_told_not_to_read_xla(mlp_args):
    params, x = mlp_args
    plain = remat_opt.peak_bytes(custom_mlp, params, x)
    options = remat_opt.SolverOptions(deterministic_time_limit=5.0)
    with pytest.warns(UnknownPrimitiveWarning, match="test_one_minus_square"):
        remat_opt.optimize(custom_mlp, int(0.9 * plain), xla_facts=False, solver_options=options).plan(params, x)
    step = remat_opt.optimize(custom_mlp, int(0.9 * plain), solver_options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownPrimitiveWarning)
        plan = step.plan(params, x)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert abs(plan.predicted_peak_bytes / plan.measured_peak_bytes - 1) < 0.05
    got = jax.grad(step)(params, x)
    want = jax.grad(custom_mlp)(params, x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
