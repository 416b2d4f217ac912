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

from ..rewrite._policies import NAME_RECIPES

RECIPES: dict[str, tuple[str, ...]] = NAME_RECIPES
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
