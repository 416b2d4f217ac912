"""The :class:`ModelSpec` record of a model family, and the zoo's init helpers."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ModelSpec", "normal", "numpy_rng", "to_jax"]


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build, run and size one model family.

    Attributes:
        name: Registry key of the family (``"mlp"``, ``"resnet"``, ...).
        config_type: The frozen dataclass holding the family's sizes.
        default_config: A CPU-friendly instance of ``config_type``.
        init: ``init(config, key) -> (params, batch)``; deterministic in ``key``.
        loss: ``loss(params, batch, *, layer_wrapper=None) -> scalar float32``.
        num_layers: ``num_layers(config) -> int``, how many times ``loss`` calls
            ``layer_wrapper`` per trace (one call per wrapped layer).
    """

    name: str
    config_type: type
    default_config: Any
    init: Callable[[Any, jax.Array], tuple[dict[str, Any], dict[str, jax.Array]]]
    loss: Callable[..., jax.Array]
    num_layers: Callable[[Any], int]


def numpy_rng(key: jax.Array) -> np.random.Generator:
    """A NumPy generator seeded deterministically by a JAX PRNG key.

    The zoo draws initial parameters and synthetic batches on the host: eager
    ``jax.random.normal`` compiles one XLA program per distinct shape (about half a
    second each on a small CPU), which would dominate model construction.

    Args:
        key: A typed (``jax.random.key``) or raw uint32 (``jax.random.PRNGKey``) key.

    Returns:
        A generator whose stream depends only on the key's data.
    """
    data = np.asarray(jax.random.key_data(key)).ravel()
    return np.random.default_rng([int(v) for v in data])


def normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Draws a float32 array from ``N(0, std**2)``.

    Args:
        rng: The generator to draw from.
        shape: Shape of the array.
        std: Standard deviation.

    Returns:
        A float32 NumPy array.
    """
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def to_jax(tree: Any) -> Any:
    """Converts every NumPy leaf of a pytree to a JAX array (dtype kept).

    Args:
        tree: A pytree of NumPy arrays.

    Returns:
        The same pytree of ``jax.Array``.
    """
    return jax.tree.map(jnp.asarray, tree)
