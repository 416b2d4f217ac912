"""Tests of the model zoo's common contract (see ``remat_opt.zoo``'s docstring)."""

import functools
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core

from remat_opt.zoo import MODELS, GPTConfig, MLPConfig, ResNetConfig, UNetConfig, gpt

SMALL: dict[str, Any] = {
    "mlp": MLPConfig(depth=4, width=16, batch=8),
    "resnet": ResNetConfig(image_size=8, in_channels=3, widths=(4, 8), blocks_per_stage=2,
                           num_classes=5, batch=2),
    "unet": UNetConfig(length=16, in_channels=2, out_channels=1, widths=(4, 8, 16), batch=2),
    "gpt": GPTConfig(num_layers=2, d_model=16, num_heads=2, seq_len=8, batch=2, vocab=32),
}


def _setup(name: str) -> tuple[Any, Any, Any, Any]:
    spec = MODELS[name]
    config = SMALL[name]
    params, batch = spec.init(config, jax.random.key(0))
    return spec, config, params, batch


@functools.cache
def _plain_value_and_grad(name: str) -> tuple[Any, Any]:
    spec, _, params, batch = _setup(name)
    return jax.jit(jax.value_and_grad(spec.loss))(params, batch)


def test_registry_and_defaults() -> None:
    assert sorted(MODELS) == ["gpt", "mlp", "resnet", "unet"]
    assert set(SMALL) == set(MODELS)
    for name, spec in MODELS.items():
        assert spec.name == name
        assert isinstance(spec.default_config, spec.config_type)
        assert isinstance(SMALL[name], spec.config_type)
        assert spec.num_layers(spec.default_config) >= 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_init_contract(name: str) -> None:
    spec, config, params, batch = _setup(name)
    assert isinstance(params["layers"], list)
    assert all(isinstance(lp, dict) for lp in params["layers"])
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert all(x.dtype in (jnp.float32, jnp.int32) for x in batch.values())
    params2, batch2 = spec.init(config, jax.random.key(0))
    for a, b in zip(jax.tree.leaves((params, batch)), jax.tree.leaves((params2, batch2)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    params3, _ = spec.init(config, jax.random.key(1))
    assert any(not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(params["layers"][0]), jax.tree.leaves(params3["layers"][0]),
                   strict=True))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_loss_and_grad_finite(name: str) -> None:
    _, _, params, _ = _setup(name)
    value, grads = _plain_value_and_grad(name)
    assert value.shape == () and value.dtype == jnp.float32
    assert np.isfinite(value)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(g)) for g in leaves)
    assert any(np.any(g != 0) for g in leaves)
    # every layer gets a gradient
    assert all(any(np.any(g != 0) for g in jax.tree.leaves(lg)) for lg in grads["layers"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_checkpoint_wrapper_matches(name: str) -> None:
    spec, _, params, batch = _setup(name)
    ckpt = jax.jit(jax.value_and_grad(
        lambda p, b: spec.loss(p, b, layer_wrapper=lambda f: jax.checkpoint(f))))
    v0, g0 = _plain_value_and_grad(name)
    v1, g1 = ckpt(params, batch)
    np.testing.assert_allclose(v1, v0, rtol=1e-5, atol=1e-6)
    assert jax.tree.structure(g1) == jax.tree.structure(g0)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # layer_wrapper=None is exactly the identity wrapper: same program
    plain_jaxpr = jax.make_jaxpr(spec.loss)(params, batch)
    identity_jaxpr = jax.make_jaxpr(lambda p, b: spec.loss(p, b, layer_wrapper=lambda f: f))(
        params, batch)
    assert str(identity_jaxpr) == str(plain_jaxpr)
    # the wrapper really wraps the layers: the checkpointed trace has remat equations
    jaxpr = jax.make_jaxpr(lambda p, b: spec.loss(p, b, layer_wrapper=jax.checkpoint))(
        params, batch)
    n_remat = sum(str(e.primitive).startswith(("remat", "checkpoint")) for e in jaxpr.eqns)
    assert n_remat == spec.num_layers(SMALL[name])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_wrapper_called_once_per_layer(name: str) -> None:
    spec, config, params, batch = _setup(name)
    calls: list[Any] = []

    def counting(f: Any) -> Any:
        calls.append(f)
        return f

    jax.make_jaxpr(lambda p, b: spec.loss(p, b, layer_wrapper=counting))(params, batch)
    assert len(calls) == spec.num_layers(config) == len(params["layers"])
    assert all(callable(f) for f in calls)
    calls.clear()
    jax.make_jaxpr(lambda p, b: spec.loss(p, b, layer_wrapper=counting))(params, batch)
    assert len(calls) == spec.num_layers(config)


def _computed(jaxpr: core.Jaxpr) -> Iterator[core.Var]:
    """The values ``jaxpr`` computes: a call's (jit, custom_jvp) are its body's."""
    for eqn in jaxpr.eqns:
        bodies = [p for p in eqn.params.values() if isinstance(p, (core.Jaxpr, core.ClosedJaxpr))]
        if bodies:
            body = bodies[0]
            yield from _computed(body.jaxpr if isinstance(body, core.ClosedJaxpr) else body)
        else:
            yield from eqn.outvars


def test_gpt_attention_scores_dominate_at_seq_512() -> None:
    # Defaults with seq_len=512: one score tensor is B*H*S*S*4 = 4*4*512*512*4 = 16 MiB,
    # while a (B, S, d_model) activation is 4*512*128*4 = 1 MiB and the largest non-score
    # activation, the MLP hidden (B, S, 4*d_model), is 4 MiB. Over the whole block the
    # S x S intermediates (scores, scaled, masked, shifted, exp, probs: 6 x 16 MiB) also
    # outweigh all other intermediates together (~70 MiB, the MLP's GELU mostly). From
    # jax 0.12.1 the softmax is one custom_jvp equation (and the mask a jit): the values
    # are counted inside the calls, where XLA computes them.
    config = GPTConfig(seq_len=512)
    s = config.seq_len
    score_bytes = gpt.attention_score_bytes(config)
    assert score_bytes == config.batch * config.num_heads * s * s * 4 == 16 * 2**20
    layer_params = gpt.init(config, jax.random.key(0))[0]["layers"][0]
    x = jax.ShapeDtypeStruct((config.batch, s, config.d_model), jnp.float32)
    jaxpr = jax.make_jaxpr(gpt.block)(layer_params, x)
    square, other = [], []
    for var in _computed(jaxpr.jaxpr):
        nbytes = math.prod(var.aval.shape) * var.aval.dtype.itemsize
        is_scores = var.aval.ndim == 4 and var.aval.shape[-2:] == (s, s)
        (square if is_scores else other).append(nbytes)
    assert len(square) >= 6
    assert max(square) == score_bytes
    assert score_bytes > 2 * max(other)
    assert sum(square) > sum(other)
