"""Model zoo: small plain-JAX models used as the demo default and as benchmarks.

Families (one module each): ``mlp`` (a pure chain of ``tanh`` layers), ``resnet``
(NHWC residual CNN, classification), ``unet`` (1-D U-Net with long skip connections,
regression) and ``gpt`` (pre-LN decoder-only transformer, next-token prediction).
:data:`MODELS` maps each family name to its :class:`ModelSpec`.

Common contract of every family:

* ``init(config, key) -> (params, batch)``. ``params`` is a dict pytree of float32
  arrays; per-layer parameters are a Python list of per-layer dicts,
  ``params["layers"][i]``, so the program is unrolled (no ``lax.scan``). ``batch``
  is a dict of arrays (float inputs and/or int32 labels or tokens). The same key
  always gives the same arrays; weights are scaled-normal, so the loss and its
  gradients are finite and the gradients are not all zero. Arrays are drawn on the
  host by a NumPy generator seeded from the key's data (fast, no XLA compilation),
  so ``init`` must be called outside ``jax.jit``/``eval_shape``.
* ``loss(params, batch, *, layer_wrapper=None) -> scalar float32``. If given,
  ``layer_wrapper`` is applied to each layer's function right before that layer is
  called, e.g. ``layer_wrapper=lambda f: jax.checkpoint(f, policy=...)``; it is
  called exactly ``num_layers(config)`` times per trace. A layer function takes
  ``(layer_params, x)`` and returns the new activation. Exception: U-Net up layers
  take ``(layer_params, x, skip)``, so a wrapper must forward extra positional
  arguments (``jax.checkpoint`` does). ``layer_wrapper=None`` gives exactly the same
  computation as ``layer_wrapper=lambda f: f``. Stems, embeddings and heads are not
  wrapped layers.
* ``num_layers(config) -> int``: the number of wrapped layers.

Example:
    >>> import jax
    >>> spec = MODELS["gpt"]
    >>> params, batch = spec.init(spec.default_config, jax.random.key(0))
    >>> step = jax.jit(jax.value_and_grad(spec.loss))
    >>> value, grads = step(params, batch)
"""

from ._spec import ModelSpec as ModelSpec
from .gpt import SPEC as _GPT_SPEC
from .gpt import GPTConfig as GPTConfig
from .gpt import attention_score_bytes as attention_score_bytes
from .gpt import init as init_gpt
from .gpt import loss as gpt_loss
from .mlp import SPEC as _MLP_SPEC
from .mlp import MLPConfig as MLPConfig
from .mlp import init as init_mlp
from .mlp import loss as mlp_loss
from .resnet import SPEC as _RESNET_SPEC
from .resnet import ResNetConfig as ResNetConfig
from .resnet import init as init_resnet
from .resnet import loss as resnet_loss
from .unet import SPEC as _UNET_SPEC
from .unet import UNetConfig as UNetConfig
from .unet import init as init_unet
from .unet import loss as unet_loss

MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (_MLP_SPEC, _RESNET_SPEC, _UNET_SPEC, _GPT_SPEC)
}
"""Registry of the zoo: family name -> :class:`ModelSpec`."""

__all__ = [
    "MODELS",
    "ModelSpec",
    "MLPConfig",
    "init_mlp",
    "mlp_loss",
    "ResNetConfig",
    "init_resnet",
    "resnet_loss",
    "UNetConfig",
    "init_unet",
    "unet_loss",
    "GPTConfig",
    "init_gpt",
    "gpt_loss",
    "attention_score_bytes",
]
