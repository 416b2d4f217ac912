"""Deep MLP: a pure chain of ``tanh(x @ w + b)`` layers.

The simplest benchmark: every layer consumes only the previous activation, so the
program's dataflow graph is a straight line and the classic ``sqrt(n)`` checkpointing
schedule applies directly.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ._spec import ModelSpec, normal, numpy_rng, to_jax

__all__ = ["MLPConfig", "init", "layer", "loss", "num_layers", "SPEC"]

Params = dict[str, Any]
Batch = dict[str, jax.Array]
LayerFn = Callable[..., jax.Array]


@dataclass(frozen=True)
class MLPConfig:
    """Sizes of the deep MLP.

    Attributes:
        depth: Number of ``tanh(x @ w + b)`` layers (each one is a wrapped layer).
        width: Feature width of every layer (input, hidden and output).
        batch: Number of examples in the generated batch.
    """

    depth: int = 16
    width: int = 256
    batch: int = 512


def init(config: MLPConfig, key: jax.Array) -> tuple[Params, Batch]:
    """Creates parameters and a synthetic regression batch.

    Args:
        config: Model sizes.
        key: PRNG key; the same key always gives the same arrays.

    Returns:
        ``(params, batch)`` where ``params["layers"][i]`` holds ``w`` of shape
        ``(width, width)`` (normal, std ``1/sqrt(width)``) and ``b`` of shape
        ``(width,)``, and ``batch`` holds float32 inputs ``x`` and targets ``y`` of
        shape ``(batch, width)``.
    """
    if config.depth < 1 or config.width < 1 or config.batch < 1:
        raise ValueError(f"all MLP sizes must be positive, got {config}")
    rng = numpy_rng(key)
    scale = 1.0 / math.sqrt(config.width)
    layers = [
        {
            "w": normal(rng, (config.width, config.width), scale),
            "b": normal(rng, (config.width,), 0.1),
        }
        for _ in range(config.depth)
    ]
    x = normal(rng, (config.batch, config.width), 1.0)
    y = normal(rng, (config.batch, config.width), 0.5)
    return to_jax(({"layers": layers}, {"x": x, "y": y}))


def layer(layer_params: Params, x: jax.Array) -> jax.Array:
    """One MLP layer.

    Args:
        layer_params: ``{"w": (width, width), "b": (width,)}``.
        x: Activation of shape ``(batch, width)``.

    Returns:
        ``tanh(x @ w + b)``, same shape as ``x``.
    """
    return jnp.tanh(x @ layer_params["w"] + layer_params["b"])


def loss(
    params: Params,
    batch: Batch,
    *,
    layer_wrapper: Callable[[LayerFn], LayerFn] | None = None,
) -> jax.Array:
    """Mean squared error of the chain's output against ``batch["y"]``.

    Args:
        params: As returned by :func:`init`.
        batch: As returned by :func:`init`.
        layer_wrapper: Applied to :func:`layer` once per layer before calling it,
            e.g. ``lambda f: jax.checkpoint(f)``; ``None`` means no wrapping.

    Returns:
        Scalar float32 loss.
    """
    wrap = layer_wrapper if layer_wrapper is not None else (lambda f: f)
    h = batch["x"]
    for layer_params in params["layers"]:
        h = wrap(layer)(layer_params, h)
    return jnp.mean(jnp.square(h - batch["y"]))


def num_layers(config: MLPConfig) -> int:
    """Number of wrapped layers of a model.

    Args:
        config: Model sizes.

    Returns:
        ``config.depth``.
    """
    return config.depth


SPEC = ModelSpec(
    name="mlp",
    config_type=MLPConfig,
    default_config=MLPConfig(),
    init=init,
    loss=loss,
    num_layers=num_layers,
)
