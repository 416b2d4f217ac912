"""The mesh layout of arguments that arrive as tracers, under ``jax.jit`` or ``jax.grad``.

``jax.jit(jax.value_and_grad(step))(params, batch)`` calls ``step`` on tracers. A plan must be
made for what each device holds, so the planner needs the layout the arrays had. It is read,
in order, from:

1. the value under the tracer, when it is concrete (eager ``jax.grad`` on placed arrays);
2. the enclosing ``jax.jit`` call being traced: the ``in_shardings`` it was given, else the
   sharding of the array it was passed. JAX keeps them in that call's frame, not in the traced
   values: on ``Auto`` mesh axes a tracer's type records the mesh, never how the array is
   split over it (jax 0.10; on jax 0.12 too, unless the axes are ``Explicit``). Each tracer is matched to the call's argument it wraps (under
   ``jax.grad``'s tracers, the ``jit``'s own argument tracer); failing that, by position, when
   the call's array arguments have the leaves' shapes and dtypes in order. A value computed
   inside the ``jit`` (not an argument of it) gives nothing;
3. the tracer's type (``jax.typeof(x).sharding``), where JAX records the layout: on a mesh of
   ``Explicit`` axes only, and with a concrete mesh of the same shape known.

Reading (2) walks the Python stack to JAX's private ``_trace_for_jit``: kept to this module,
and any surprise (a renamed frame or local on a later JAX) gives ``None``, the layout unknown,
as before: the planner then falls back on a plan made on the arrays (``planner/_mesh.sharded_twin``)
or on ``optimize(..., in_shardings=...)``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

import jax

from ._static import mesh_sharding

_TRACE_FRAMES = ("trace_to_jaxpr", "trace_to_jaxpr_nocache")
"""The functions whose frame holds the traced call's argument tracers, ``in_tracers`` (jax 0.10, 0.12)."""

_JIT_FRAME = "_trace_for_jit"
"""The function of ``jax._src.pjit`` whose frame holds a traced ``jit`` call's arguments and shardings."""


def traced_layout(leaves: Sequence[Any]) -> list[jax.sharding.Sharding | None]:
    """Per array leaf of a call (tracers or arrays), its mesh sharding, where known (else ``None``)."""
    known = [mesh_sharding(_concrete(x)) for x in leaves]
    if all(s is not None or not isinstance(x, jax.core.Tracer) for s, x in zip(known, leaves)):
        return known
    given = _jit_shardings(leaves)
    meshes = [s.mesh for s in (*known, *(given or ())) if isinstance(s, jax.sharding.NamedSharding)
              and isinstance(s.mesh, jax.sharding.Mesh)]
    out = []
    for k, x in enumerate(leaves):
        sharding = known[k] or (given[k] if given else None)
        if sharding is None and isinstance(x, jax.core.Tracer):
            sharding = _typed(x, meshes)
        out.append(sharding)
    return out


def _concrete(x: Any) -> Any:
    """The value under nested JVP/linearize tracers, if it is concrete; else ``x``."""
    while isinstance(x, jax.core.Tracer):
        primal = getattr(x, "primal", None)
        if primal is None:
            return x
        x = primal
    return x


def _jit_shardings(leaves: Sequence[Any]) -> list[jax.sharding.Sharding | None] | None:
    """The shardings of the innermost ``jax.jit`` call being traced, matched to ``leaves``: each
    leaf whose value under its JVP tracers is one of the call's argument tracers takes that
    argument's; failing that for any leaf, by position, when the call's array arguments have the
    leaves' shapes and dtypes in the same order."""
    try:
        frame: types.FrameType | None = sys._getframe(1)
        arg_tracers = None
        while frame is not None and not (frame.f_code.co_name == _JIT_FRAME
                                         and frame.f_globals.get("__name__", "").endswith("pjit")):
            if frame.f_code.co_name in _TRACE_FRAMES and arg_tracers is None:
                found = frame.f_locals.get("in_tracers")
                arg_tracers = list(getattr(found, "vals", found) or [])
            frame = frame.f_back
        if frame is None:
            return None
        values = list(frame.f_locals["args_ft"].vals)
        given = list(frame.f_locals.get("in_shardings_flat") or [None] * len(values))
    except (KeyError, AttributeError, TypeError, ValueError):  # another JAX's internals: unknown
        return None
    if len(given) != len(values):
        return None
    shardings = [g if isinstance(g, jax.sharding.Sharding) else mesh_sharding(_concrete(v))
                 for g, v in zip(given, values)]
    shardings = [s if s is not None and _spans_devices(s) else None for s in shardings]
    if arg_tracers is not None and len(arg_tracers) == len(values):
        position = {id(t): k for k, t in enumerate(arg_tracers)}
        found = [position.get(id(_innermost(x, position))) for x in leaves]
        if all(k is not None for k in found):
            return [shardings[k] for k in found if k is not None]
    pairs = [(v, s) for v, s in zip(values, shardings) if hasattr(v, "shape") and hasattr(v, "dtype")]
    if [(tuple(v.shape), str(v.dtype)) for v, _ in pairs] != [(tuple(jax.numpy.shape(x)),
                                                              str(jax.numpy.result_type(x))) for x in leaves]:
        return None
    return [s for _, s in pairs]


def _innermost(x: Any, wanted: dict[int, int]) -> Any:
    """``x`` or the first value under its JVP tracers whose id is in ``wanted``, else ``x``."""
    while id(x) not in wanted:
        primal = getattr(x, "primal", None)
        if primal is None:
            return x
        x = primal
    return x


def _spans_devices(sharding: jax.sharding.Sharding) -> bool:
    try:
        return len(sharding.device_set) > 1
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return False


def _typed(x: Any, meshes: Sequence[jax.sharding.Mesh]) -> jax.sharding.Sharding | None:
    """The layout in ``x``'s type, on a mesh of ``Explicit`` axes only, laid on a concrete mesh
    of the same shape: one of ``meshes``, the mesh set with ``jax.set_mesh``, or ``jax.make_mesh``'s."""
    try:
        typed = jax.typeof(x).sharding
        abstract = typed.mesh
        explicit = jax.sharding.AxisType.Explicit
        if abstract.empty or any(t != explicit for t in abstract.axis_types):
            return None
        candidates = [*meshes, jax.sharding.get_mesh()]
        concrete = next((m for m in candidates if not m.empty and m.abstract_mesh == abstract), None)
        if concrete is None:
            made = jax.make_mesh(abstract.axis_sizes, abstract.axis_names, axis_types=abstract.axis_types)
            concrete = made if made.abstract_mesh == abstract else None
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    if concrete is None:
        return None
    return mesh_sharding(jax.ShapeDtypeStruct(x.shape, x.dtype,
                                              sharding=jax.sharding.NamedSharding(concrete, typed.spec)))
