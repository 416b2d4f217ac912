"""JAX's built-in checkpoint policies, applied as a user would write them.

Around the whole function (:func:`policy_program`) or around each layer
through the zoo's ``layer_wrapper`` convention (:func:`layer_policy_program`).
Plain ``jax.checkpoint``, unfenced: on XLA:CPU it is often undone by CSE and
scheduling (docs/xla_findings.md §1), which is what the baselines show; per
layer, also fenced, as a user could write it with remat_opt's fence.

Arguments with static leaves (an Equinox module's activation functions) are
checkpointed the way ``eqx.filter_checkpoint`` does it: only the array leaves
go through ``jax.checkpoint``; the others are closed over
(:func:`filtered_checkpoint`). ``jax.checkpoint`` itself rejects a leaf that is
not an array.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax

from ..program._static import combine, split
from ._rewrite import fenced_checkpoint

POLICIES: dict[str, Callable[..., bool]] = {
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
}
"""JAX's built-in checkpoint policies compared here, by name."""

_QKV = ("query_proj", "key_proj", "value_proj")

NAME_RECIPES: dict[str, tuple[str, ...]] = {
    "full": (),
    "save_out_proj": ("out_proj",),
    "save_qkv_proj": _QKV,
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "minimal": (*_QKV, "out_proj", "mlpwi", "mlpwo"),
    "minimal_with_context": (*_QKV, "context", "out_proj", "mlpwi", "mlpwo"),
}
"""MaxText's remat recipes (``remat_policy``): recipe name -> the ``checkpoint_name``s its
``save_only_these_names`` policy saves on a decoder layer (``full`` saves none). The planner
measures them on a scan body carrying those names (:func:`remat_opt.rewrite._loops.recipe_candidates`);
:mod:`remat_opt.baselines._maxtext` offers them as baselines."""


def policy_by_name(policy: str) -> Callable[..., bool]:
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}; got {policy!r}.")
    return POLICIES[policy]


def filtered_checkpoint(fn: Callable[..., Any], policy: Callable[..., bool]) -> Callable[..., Any]:
    """``jax.checkpoint(fn, policy=policy)`` over the array leaves of the arguments only.

    The static leaves of a call (:mod:`remat_opt.program._static`: functions,
    Python scalars) are closed over, as ``eqx.filter_checkpoint`` does; with
    none, this is ``jax.checkpoint(fn, policy=policy)`` on the same arguments.
    """
    plain = jax.checkpoint(fn, policy=policy)

    @functools.wraps(fn)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        leaves, static = split((args, kwargs))
        if not static.any:
            return plain(*args, **kwargs)

        def on_arrays(arrays: list) -> Any:
            a, k = combine(arrays, static)
            return fn(*a, **k)

        return jax.checkpoint(on_arrays, policy=policy)(leaves)

    return checkpointed


def policy_program(fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
    """``jax.checkpoint(fn, policy=...)``, as a user would write it (static leaves closed over)."""
    return filtered_checkpoint(fn, policy_by_name(policy))


def layer_policy_program(loss: Callable[..., Any], policy: str, fenced: bool = False) -> Callable[..., Any]:
    """``loss`` with ``jax.checkpoint(layer, policy=...)`` around each layer.

    With ``fenced``, each layer's backward is fenced as remat_opt's own
    segments are (:func:`remat_opt.rewrite._rewrite.fenced_checkpoint`), so XLA
    cannot merge the recomputation back into the forward: the per-layer plan a
    user can write with that fence.

    Raises:
        TypeError: ``loss`` takes no ``layer_wrapper`` keyword argument.
    """
    parameters: Mapping[str, inspect.Parameter]
    try:
        parameters = inspect.signature(loss).parameters
    except (TypeError, ValueError):
        parameters = {}
    takes_wrapper = "layer_wrapper" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
    if not takes_wrapper:
        raise TypeError(
            f"loss must accept a layer_wrapper keyword argument (the zoo's convention) for a "
            f"per-layer policy; got {loss!r}. Use checkpoint_policy for the whole function."
        )
    pol = policy_by_name(policy)
    if fenced:
        return functools.partial(loss, layer_wrapper=lambda layer: fenced_checkpoint(layer, (), policy=pol))
    return functools.partial(loss, layer_wrapper=lambda layer: filtered_checkpoint(layer, pol))
