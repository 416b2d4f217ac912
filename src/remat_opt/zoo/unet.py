"""Small 1-D U-Net (NWC layout) with long skip connections, trained with MSE.

The model is one-dimensional (sequences of shape ``(batch, length, channels)``,
``lax.conv_general_dilated`` with ``("NWC", "WIO", "NWC")``). With
``L = len(widths)`` levels, ``params["layers"]`` holds ``2 * L - 1`` entries, in
execution order:

* ``L`` down layers. Layer 0 is :func:`down_block` on the input; layers ``1..L-1``
  are :func:`pool_down_block` (average-pool by 2, then the conv block), the last one
  being the bottleneck. The outputs of layers ``0..L-2`` are kept as skips.
* ``L - 1`` up layers, :func:`up_block`: upsample by 2 (repeat), concatenate the skip
  of the same resolution along channels, then the conv block.

A conv block is two ``kernel``-wide convolutions, each followed by hand-written
group normalization and GELU. A 1x1 convolution (``head_w``/``head_b``, not a wrapped
layer) maps the last up layer to ``out_channels``.

Signature exception: up layers are called as ``f(layer_params, x, skip)``, so
``layer_wrapper`` must return a function that forwards extra positional arguments
(``jax.checkpoint`` does). Down layers use the plain ``f(layer_params, x)``.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._spec import ModelSpec, normal, numpy_rng, to_jax

__all__ = [
    "UNetConfig",
    "init",
    "down_block",
    "pool_down_block",
    "up_block",
    "loss",
    "num_layers",
    "SPEC",
]

Params = dict[str, Any]
Batch = dict[str, jax.Array]
LayerFn = Callable[..., jax.Array]

_DIMS = ("NWC", "WIO", "NWC")


@dataclass(frozen=True)
class UNetConfig:
    """Sizes of the 1-D U-Net.

    Attributes:
        length: Sequence length; must be divisible by ``2 ** (len(widths) - 1)``.
        in_channels: Channels of the input ``x``.
        out_channels: Channels of the output and of the target ``y``.
        widths: Channel count per level, finest first; the last is the bottleneck.
        kernel: Convolution width (odd).
        batch: Number of sequences in the generated batch.
    """

    length: int = 64
    in_channels: int = 1
    out_channels: int = 1
    widths: tuple[int, ...] = (16, 32, 64, 128)
    kernel: int = 3
    batch: int = 8


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=_DIMS)


def _group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    n, length, c = x.shape
    groups = math.gcd(c, 8)
    xg = x.reshape(n, length, groups, c // groups)
    mean = jnp.mean(xg, axis=(1, 3), keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=(1, 3), keepdims=True)
    xg = (xg - mean) * lax.rsqrt(var + eps)
    return xg.reshape(x.shape) * scale + bias


def _conv_block(layer_params: Params, x: jax.Array) -> jax.Array:
    h = _conv(x, layer_params["conv1_w"])
    h = jax.nn.gelu(_group_norm(h, layer_params["gn1_scale"], layer_params["gn1_bias"]))
    h = _conv(h, layer_params["conv2_w"])
    return jax.nn.gelu(_group_norm(h, layer_params["gn2_scale"], layer_params["gn2_bias"]))


def _block_init(rng: np.random.Generator, kernel: int, c_in: int, c_out: int) -> Params:
    return {
        "conv1_w": normal(rng, (kernel, c_in, c_out), math.sqrt(2.0 / (kernel * c_in))),
        "gn1_scale": np.ones((c_out,), np.float32),
        "gn1_bias": np.zeros((c_out,), np.float32),
        "conv2_w": normal(rng, (kernel, c_out, c_out), math.sqrt(2.0 / (kernel * c_out))),
        "gn2_scale": np.ones((c_out,), np.float32),
        "gn2_bias": np.zeros((c_out,), np.float32),
    }


def init(config: UNetConfig, key: jax.Array) -> tuple[Params, Batch]:
    """Creates parameters and a synthetic regression batch.

    Args:
        config: Model sizes.
        key: PRNG key; the same key always gives the same arrays.

    Returns:
        ``(params, batch)``: ``params`` has ``layers`` (``2 * len(widths) - 1``
        conv-block dicts, see the module docstring) and ``head_w``/``head_b``;
        ``batch`` has float32 ``x`` of shape ``(batch, length, in_channels)`` and
        ``y`` of shape ``(batch, length, out_channels)``.
    """
    levels = len(config.widths)
    if levels < 1 or config.kernel % 2 == 0:
        raise ValueError(f"U-Net needs at least one level and an odd kernel, got {config}")
    if config.length % (2 ** (levels - 1)):
        raise ValueError(f"length must be divisible by 2**(levels-1), got {config}")
    rng = numpy_rng(key)
    layers = []
    c_in = config.in_channels
    for c_out in config.widths:
        layers.append(_block_init(rng, config.kernel, c_in, c_out))
        c_in = c_out
    for level in reversed(range(levels - 1)):
        c_out = config.widths[level]
        layers.append(_block_init(rng, config.kernel, c_in + c_out, c_out))
        c_in = c_out
    c0 = config.widths[0]
    params = {
        "layers": layers,
        "head_w": normal(rng, (1, c0, config.out_channels), 1.0 / math.sqrt(c0)),
        "head_b": np.zeros((config.out_channels,), np.float32),
    }
    x = normal(rng, (config.batch, config.length, config.in_channels), 1.0)
    y = normal(rng, (config.batch, config.length, config.out_channels), 1.0)
    return to_jax((params, {"x": x, "y": y}))


def down_block(layer_params: Params, x: jax.Array) -> jax.Array:
    """First down layer: a conv block at full resolution.

    Args:
        layer_params: ``params["layers"][0]``.
        x: Input of shape ``(batch, length, in_channels)``.

    Returns:
        Activation of shape ``(batch, length, widths[0])``.
    """
    return _conv_block(layer_params, x)


def pool_down_block(layer_params: Params, x: jax.Array) -> jax.Array:
    """Later down layer (and bottleneck): average-pool by 2, then a conv block.

    Args:
        layer_params: One of ``params["layers"][1:len(widths)]``.
        x: Activation of shape ``(batch, n, c)``, ``n`` even.

    Returns:
        Activation of shape ``(batch, n // 2, c')``.
    """
    b, n, c = x.shape
    pooled = jnp.mean(x.reshape(b, n // 2, 2, c), axis=2)
    return _conv_block(layer_params, pooled)


def up_block(layer_params: Params, x: jax.Array, skip: jax.Array) -> jax.Array:
    """Up layer: upsample ``x`` by 2, concatenate ``skip``, then a conv block.

    Args:
        layer_params: One of ``params["layers"][len(widths):]``.
        x: Coarse activation of shape ``(batch, n, c)``.
        skip: Down-path activation of shape ``(batch, 2 * n, c_skip)``.

    Returns:
        Activation of shape ``(batch, 2 * n, c_skip)``.
    """
    up = jnp.repeat(x, 2, axis=1)
    return _conv_block(layer_params, jnp.concatenate([up, skip], axis=-1))


def loss(
    params: Params,
    batch: Batch,
    *,
    layer_wrapper: Callable[[LayerFn], LayerFn] | None = None,
) -> jax.Array:
    """Mean squared error of the U-Net's output against ``batch["y"]``.

    Args:
        params: As returned by :func:`init`.
        batch: As returned by :func:`init`.
        layer_wrapper: Applied to each layer function once per layer before calling
            it; up layers are then called with ``(layer_params, x, skip)``.
            ``None`` means no wrapping.

    Returns:
        Scalar float32 loss.
    """
    wrap = layer_wrapper if layer_wrapper is not None else (lambda f: f)
    layers = params["layers"]
    levels = (len(layers) + 1) // 2
    skips = []
    h = batch["x"]
    for i in range(levels):
        h = wrap(down_block if i == 0 else pool_down_block)(layers[i], h)
        if i < levels - 1:
            skips.append(h)
    for layer_params in layers[levels:]:
        h = wrap(up_block)(layer_params, h, skips.pop())
    out = _conv(h, params["head_w"]) + params["head_b"]
    return jnp.mean(jnp.square(out - batch["y"]))


def num_layers(config: UNetConfig) -> int:
    """Number of wrapped layers of a model.

    Args:
        config: Model sizes.

    Returns:
        ``2 * len(config.widths) - 1``.
    """
    return 2 * len(config.widths) - 1


SPEC = ModelSpec(
    name="unet",
    config_type=UNetConfig,
    default_config=UNetConfig(),
    init=init,
    loss=loss,
    num_layers=num_layers,
)
