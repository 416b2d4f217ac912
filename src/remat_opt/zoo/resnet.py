"""ResNet-style CNN for image classification (NHWC, ``lax.conv_general_dilated``).

Layout: a 3x3 stem convolution, then ``len(widths)`` stages of ``blocks_per_stage``
residual blocks, global average pooling and a dense classifier. A block is
``relu(gn(conv(relu(gn(conv(x))))) + shortcut(x))`` with hand-written group
normalization (no running statistics). The first block of every stage after the
first halves the resolution (stride-2 convolution) and uses a 1x1 stride-2
projection shortcut; the block detects this from the presence of ``"proj_w"`` in its
parameters, so every block has the plain ``f(layer_params, x)`` signature.
Only the residual blocks are wrapped layers; stem and head are not.
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

__all__ = ["ResNetConfig", "init", "block", "loss", "num_layers", "SPEC"]

Params = dict[str, Any]
Batch = dict[str, jax.Array]
LayerFn = Callable[..., jax.Array]

_DIMS = ("NHWC", "HWIO", "NHWC")


@dataclass(frozen=True)
class ResNetConfig:
    """Sizes of the ResNet.

    Attributes:
        image_size: Height and width of the square input images; must be divisible
            by ``2 ** (len(widths) - 1)``.
        in_channels: Channels of the input images.
        widths: Channel count of each stage.
        blocks_per_stage: Residual blocks per stage (each one is a wrapped layer).
        num_classes: Number of classes of the integer labels.
        batch: Number of images in the generated batch.
    """

    image_size: int = 16
    in_channels: int = 3
    widths: tuple[int, ...] = (16, 32, 64)
    blocks_per_stage: int = 2
    num_classes: int = 10
    batch: int = 8


def _conv(x: jax.Array, w: jax.Array, stride: int) -> jax.Array:
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=_DIMS)


def _group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    n, h, w, c = x.shape
    groups = math.gcd(c, 8)
    xg = x.reshape(n, h, w, groups, c // groups)
    mean = jnp.mean(xg, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=(1, 2, 4), keepdims=True)
    xg = (xg - mean) * lax.rsqrt(var + eps)
    return xg.reshape(x.shape) * scale + bias


def _block_init(rng: np.random.Generator, c_in: int, c_out: int, project: bool) -> Params:
    lp = {
        "conv1_w": normal(rng, (3, 3, c_in, c_out), math.sqrt(2.0 / (9 * c_in))),
        "gn1_scale": np.ones((c_out,), np.float32),
        "gn1_bias": np.zeros((c_out,), np.float32),
        "conv2_w": normal(rng, (3, 3, c_out, c_out), math.sqrt(2.0 / (9 * c_out))),
        "gn2_scale": np.ones((c_out,), np.float32),
        "gn2_bias": np.zeros((c_out,), np.float32),
    }
    if project:
        lp["proj_w"] = normal(rng, (1, 1, c_in, c_out), math.sqrt(1.0 / c_in))
    return lp


def init(config: ResNetConfig, key: jax.Array) -> tuple[Params, Batch]:
    """Creates parameters and a synthetic classification batch.

    Args:
        config: Model sizes.
        key: PRNG key; the same key always gives the same arrays.

    Returns:
        ``(params, batch)``: ``params`` has ``stem_w``/``stem_scale``/``stem_bias``,
        ``layers`` (one dict per residual block, in execution order) and
        ``head_w``/``head_b``; ``batch`` has float32 ``images`` of shape
        ``(batch, image_size, image_size, in_channels)`` and int32 ``labels`` of
        shape ``(batch,)``.
    """
    if not config.widths or config.blocks_per_stage < 1:
        raise ValueError(f"ResNet needs at least one stage and one block, got {config}")
    if config.image_size % (2 ** (len(config.widths) - 1)):
        raise ValueError(f"image_size must be divisible by 2**(stages-1), got {config}")
    rng = numpy_rng(key)
    c0, c_last = config.widths[0], config.widths[-1]
    stem_w = normal(rng, (3, 3, config.in_channels, c0), math.sqrt(2.0 / (9 * config.in_channels)))
    layers = []
    c_in = c0
    for stage, c_out in enumerate(config.widths):
        for i in range(config.blocks_per_stage):
            layers.append(_block_init(rng, c_in, c_out, project=stage > 0 and i == 0))
            c_in = c_out
    params = {
        "stem_w": stem_w,
        "stem_scale": np.ones((c0,), np.float32),
        "stem_bias": np.zeros((c0,), np.float32),
        "layers": layers,
        "head_w": normal(rng, (c_last, config.num_classes), 0.1 / math.sqrt(c_last)),
        "head_b": np.zeros((config.num_classes,), np.float32),
    }
    shape = (config.batch, config.image_size, config.image_size, config.in_channels)
    batch = {
        "images": normal(rng, shape, 1.0),
        "labels": rng.integers(0, config.num_classes, (config.batch,), dtype=np.int32),
    }
    return to_jax((params, batch))


def block(layer_params: Params, x: jax.Array) -> jax.Array:
    """One residual block; downsamples by 2 iff ``"proj_w"`` is in ``layer_params``.

    Args:
        layer_params: One entry of ``params["layers"]``.
        x: Activation of shape ``(batch, height, width, channels)``.

    Returns:
        The block's output, ``(batch, height', width', channels')``.
    """
    project = "proj_w" in layer_params
    stride = 2 if project else 1
    h = _conv(x, layer_params["conv1_w"], stride)
    h = jax.nn.relu(_group_norm(h, layer_params["gn1_scale"], layer_params["gn1_bias"]))
    h = _conv(h, layer_params["conv2_w"], 1)
    h = _group_norm(h, layer_params["gn2_scale"], layer_params["gn2_bias"])
    shortcut = _conv(x, layer_params["proj_w"], stride) if project else x
    return jax.nn.relu(h + shortcut)


def loss(
    params: Params,
    batch: Batch,
    *,
    layer_wrapper: Callable[[LayerFn], LayerFn] | None = None,
) -> jax.Array:
    """Mean softmax cross-entropy of the classifier on ``batch["labels"]``.

    Args:
        params: As returned by :func:`init`.
        batch: As returned by :func:`init`.
        layer_wrapper: Applied to :func:`block` once per residual block before
            calling it; ``None`` means no wrapping.

    Returns:
        Scalar float32 loss.
    """
    wrap = layer_wrapper if layer_wrapper is not None else (lambda f: f)
    h = _conv(batch["images"], params["stem_w"], 1)
    h = jax.nn.relu(_group_norm(h, params["stem_scale"], params["stem_bias"]))
    for layer_params in params["layers"]:
        h = wrap(block)(layer_params, h)
    pooled = jnp.mean(h, axis=(1, 2))
    logits = pooled @ params["head_w"] + params["head_b"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, batch["labels"][:, None], axis=-1)
    return -jnp.mean(picked)


def num_layers(config: ResNetConfig) -> int:
    """Number of wrapped layers (residual blocks) of a model.

    Args:
        config: Model sizes.

    Returns:
        ``len(config.widths) * config.blocks_per_stage``.
    """
    return len(config.widths) * config.blocks_per_stage


SPEC = ModelSpec(
    name="resnet",
    config_type=ResNetConfig,
    default_config=ResNetConfig(),
    init=init,
    loss=loss,
    num_layers=num_layers,
)
