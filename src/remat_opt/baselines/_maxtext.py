"""MaxText's remat recipes: the menu users of scanned decoders pick from.

MaxText (``remat_policy`` in its config) tags a decoder layer's projections
with ``checkpoint_name`` and offers a fixed set of ``save_only_these_names``
policies over those names, applied to the scanned layer. They are the
hand-made alternatives a plan for a scanned decoder should be compared with;
the zoo's scanned GPT (:func:`remat_opt.zoo.gpt.scan_loss`) carries the same
names. The recipes that move residuals to host memory (``*_offloaded``) have
no counterpart on one device's memory and are left out; ``minimal`` is the
names form of its policy (every projection), as recent MaxText releases write it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

_QKV = ("query_proj", "key_proj", "value_proj")

RECIPES: dict[str, tuple[str, ...]] = {
    "full": (),
    "save_out_proj": ("out_proj",),
    "save_qkv_proj": _QKV,
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "minimal": (*_QKV, "out_proj", "mlpwi", "mlpwo"),
    "minimal_with_context": (*_QKV, "context", "out_proj", "mlpwi", "mlpwo"),
}
"""Recipe name -> the names it saves (``full`` saves none: the layer is recomputed whole)."""


def recipe_policy(recipe: str) -> Callable[..., bool]:
    """The ``jax.checkpoint`` policy of a recipe of :data:`RECIPES`."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {sorted(RECIPES)}; got {recipe!r}.")
    return jax.checkpoint_policies.save_only_these_names(*RECIPES[recipe])


def recipe_program(scan_loss: Callable[..., Any], recipe: str) -> Callable[..., Any]:
    """``scan_loss`` with the recipe on its scan body (the zoo's ``body_policy`` keyword)."""
    policy = recipe_policy(recipe)

    def program(*args: Any, **kwargs: Any) -> Any:
        return scan_loss(*args, body_policy=policy, **kwargs)

    return program
