"""Static leaves: splitting argument pytrees into traced arrays and static values.

Model libraries pass pytrees whose leaves are not all arrays: an Equinox
module holds its activation functions, and Python floats and bools (a dropout
rate, an ``inference`` flag), as leaves, and ``eqx.filter_value_and_grad``
calls the loss with the floating arrays as tracers and every other leaf
unchanged. remat_opt traces only the array leaves (``jax.Array``, tracers
included, NumPy arrays and scalars, ``jax.ShapeDtypeStruct``); every other
leaf, Python scalars included, is *static*, as in ``eqx.filter_jit``:

- it is closed over when the function is traced, and passed through unchanged
  (Equinox's layers branch on them in Python: ``if self.inference: ...``);
- it is part of the plan's cache key, compared by hash and equality, or by
  identity when it is unhashable (or its ``==`` does not give a bool); a plan
  made for one static value is reused for an equal one.

Under ``jax.jit`` or ``jax.grad`` every leaf the function sees is already an
array or a tracer, so static leaves only arise where the caller passes Python
objects through: Equinox's filtered transformations, or plain calls.

Every stage that flattens the user's arguments (trace, the plan cache, the
rewritten step and the XLA measurement) goes through :func:`split` and
:func:`combine`, so that they agree on which flat input is which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)
"""Leaves traced as arrays (tracers are ``jax.Array`` instances); the rest are static."""


def is_traced(leaf: Any) -> bool:
    """Whether remat_opt traces ``leaf`` (an array) or keeps it static."""
    return isinstance(leaf, ARRAY_TYPES)


def is_inexact_array(leaf: Any) -> bool:
    """A floating or complex array: what ``eqx.filter_value_and_grad`` differentiates."""
    return is_traced(leaf) and jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact)


@dataclass(frozen=True, eq=False)
class StaticLeaf:
    """A static leaf as a cache key: by hash and ``==``, or by identity if unhashable."""

    value: Any

    def _hash(self) -> int | None:
        try:
            return hash(self.value)
        except TypeError:
            return None

    def __hash__(self) -> int:
        h = self._hash()
        return id(self.value) if h is None else h

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StaticLeaf):
            return NotImplemented
        a, b = self.value, other.value
        if a is b:
            return True
        if type(a) is not type(b) or self._hash() is None or other._hash() is None:
            return False
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001 - an `==` that does not give a bool: compare by identity.
            return False


@dataclass(frozen=True)
class Static:
    """Everything about ``(args, kwargs)`` but its traced leaves; hashable.

    Attributes:
        treedef: structure of the whole tree, static leaves included.
        leaves: per leaf of ``treedef``, its :class:`StaticLeaf`, or ``None``
            where the leaf is traced.
        traced_treedef: structure of the tree with static leaves removed: its
            leaves are the traced ones, in order, with their argument paths.
    """

    treedef: Any
    leaves: tuple[StaticLeaf | None, ...]
    traced_treedef: Any

    @property
    def any(self) -> bool:
        """Whether any leaf is static."""
        return any(s is not None for s in self.leaves)


def split(arguments: Any) -> tuple[list[Any], Static]:
    """The traced leaves of ``arguments``, in flattening order, and the rest of it.

    Args:
        arguments: the pair ``(args, kwargs)`` of a call (any pytree works; the
            pair only names the leaves in errors).

    Returns:
        The array leaves, and the :class:`Static` that :func:`combine` puts them back into.

    Raises:
        TypeError: an array leaf has a dtype JAX cannot trace (object, str, bytes),
            naming the leaf: ``args[0]['names']``.

    Example:
        >>> import jax.numpy as jnp
        >>> leaves, static = split(({"w": jnp.ones(2), "act": jnp.tanh}, {}))
        >>> len(leaves), static.any
        (1, True)
    """
    leaves, treedef = jax.tree_util.tree_flatten(arguments)
    marks = tuple(None if is_traced(x) else StaticLeaf(x) for x in leaves)
    for i, x in enumerate(leaves):
        if marks[i] is None and not _traceable(x.dtype):
            raise TypeError(
                f"argument leaf {_label(arguments, i)} is an array of dtype {x.dtype}, which JAX "
                "cannot trace. Pass a numeric array, or another object (a tuple of strings, ...): "
                "remat_opt keeps leaves that are not arrays static."
            )
    traced_tree = jax.tree_util.tree_unflatten(treedef, [None if m else x for x, m in zip(leaves, marks)])
    traced_treedef = jax.tree_util.tree_structure(traced_tree)
    return [x for x, m in zip(leaves, marks) if m is None], Static(treedef, marks, traced_treedef)


def _traceable(dtype: Any) -> bool:
    """Whether JAX traces arrays of ``dtype``. Not objects, strings or structured records; but
    NumPy calls ml_dtypes' types (bfloat16, float8_*, int4) "void" (kind ``V``) too, and JAX
    traces those, as it does key types (not NumPy dtypes at all)."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "OSUV":
        return True
    return dtype.kind == "V" and jax.numpy.issubdtype(dtype, jax.numpy.number)


def combine(traced: Sequence[Any], static: Static) -> Any:
    """The inverse of :func:`split`: ``traced`` put back among the static leaves."""
    it = iter(traced)
    leaves = [next(it) if s is None else s.value for s in static.leaves]
    return jax.tree_util.tree_unflatten(static.treedef, leaves)


def owners(args: tuple, kwargs: dict) -> list[int | None]:
    """Per traced leaf of ``(args, kwargs)``: its positional argument index, ``None`` for kwargs."""
    out: list[int | None] = []
    for i, arg in enumerate(args):
        out += [i] * sum(map(is_traced, jax.tree_util.tree_leaves(arg)))
    return out + [None] * sum(map(is_traced, jax.tree_util.tree_leaves(kwargs)))


def differentiated(args: tuple, kwargs: dict, argnums: Sequence[int]) -> list[bool]:
    """Per traced leaf of ``(args, kwargs)``: a floating array of an ``argnums``
    argument (normalized indices), the leaves a gradient is taken for."""
    leaves, _ = split((args, kwargs))
    return [owner in argnums and is_inexact_array(x) for owner, x in zip(owners(args, kwargs), leaves)]


def _label(arguments: Any, index: int) -> str:
    """The ``index``-th leaf's place in ``(args, kwargs)``: ``args[0]['w']``, ``kwargs['x']``."""
    path = jax.tree_util.tree_flatten_with_path(arguments)[0][index][0]
    heads: dict[int | None, str] = {0: "args", 1: "kwargs"}
    head = heads.get(getattr(path[0], "idx", None), "") if path else ""
    return head + jax.tree_util.keystr(tuple(path[1:] if head else path))


def mesh_sharding(x: Any) -> jax.sharding.Sharding | None:
    """The sharding of an argument laid out over several devices, else ``None``.

    A ``jax.Array`` or ``jax.ShapeDtypeStruct`` with a sharding that spans more
    than one device (a ``NamedSharding`` on a ``Mesh``, a
    ``PositionalSharding``...) keeps it; an array on one device, a NumPy array
    and a tracer have none, so single-device programs compile as before.
    """
    if isinstance(x, jax.core.Tracer) or not isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return None
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
        return None
    try:
        return sharding if len(sharding.device_set) > 1 else None
    except (AttributeError, TypeError, ValueError, RuntimeError):  # an abstract sharding: no devices to compile for
        return None
