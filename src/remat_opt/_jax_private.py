"""Every private JAX name remat_opt uses, in one place: the only module that imports ``jax._src``.

Everything else comes from public JAX: the jaxpr types (``Var``, ``Literal``, ``Jaxpr``,
``JaxprEqn``, ``ClosedJaxpr``, ``subjaxprs``, ``jaxprs_in_params``) from ``jax.extend.core``,
``Tracer``, ``ShapedArray`` and ``eval_jaxpr`` from ``jax.core``, the source-info contexts from
``jax.extend.source_info_util`` and ``use_abstract_mesh`` from ``jax.sharding``.
``tests/test_architecture.py`` checks that no other module imports ``jax._src``.

The names below have no public equivalent in jax 0.10.2 or 0.12. Per name, what it is needed
for and the public API that would replace it:

- :func:`user_frames` (``source_info_util.user_frames``): the user's frames of an equation's
  traceback, to name the user's source line in errors and reports. Would be replaced by a
  ``user_frames`` in ``jax.extend.source_info_util`` (which exports ``summarize`` only).
- :data:`primitive_jvps` (``ad.primitive_jvps``): whether a primitive has a JVP rule, so that
  tracing refuses a tangent flowing into one that has none. Would be replaced by a public
  query of a primitive's differentiation rules.
- :data:`remat_allowed_effects` (``effects.remat_allowed_effects``): the effects JAX allows
  inside ``jax.checkpoint``, so that tracing refuses the others. Would be replaced by a public
  effects registry.
- :func:`partial_eval_jaxpr_nounits` (``partial_eval``): splits the JVP jaxpr into its known
  (forward) and linear (backward) parts and names the residuals between them, the values the
  memory model counts. ``jax.linearize`` does this on a function, but hides the jaxprs.
- :func:`dce_jaxpr` (``partial_eval``): drops dead equations before counting FLOPs, as XLA
  would. Would be replaced by a public jaxpr DCE.
- :func:`trace_context` (``config.trace_context``): the JAX configuration ``jax.jit`` keys its
  trace cache by (x64, default matmul precision...), so that a cached trace is reused under the
  same configuration only. Guarded: without it (a JAX that renamed it) the key is ``()``.
- :func:`check_vma`, :func:`extend_axis_env`, :func:`as_manual_mesh` (``config._check_vma``,
  ``shard_map._extend_axis_env``, ``shard_map._as_manual_mesh``): the contexts JAX's own
  ``shard_map`` traces its body in, so that a ``shard_map`` body is traced as JAX traces it.
  Would be replaced by a public way to trace a function as a ``shard_map`` body.
- :data:`JVPTrace`, :data:`JVPTracer`, :data:`DynamicJaxprTrace`, :func:`current_trace`
  (``ad``, ``partial_eval``, ``core.trace_ctx``): whether JAX is forward-differentiating the
  current call (:mod:`remat_opt.planner._forward`). Would be replaced by a public "under which
  transformations" query. Guarded: a JAX that moved them makes forward mode undetected (each
  is then ``()``, which no ``isinstance`` matches) rather than the import fail.

Not an import, so not here: :mod:`remat_opt.program._traced_layout` reads the locals of
``jax._src.pjit``'s frame that traces a ``jax.jit`` call (the call's shardings), and returns
``None`` when they are not there.
"""

from __future__ import annotations

from typing import Any

from jax._src import config as _config
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import source_info_util as _source_info_util
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import partial_eval as _pe
from jax._src.shard_map import _as_manual_mesh, _extend_axis_env

__all__ = [
    "DynamicJaxprTrace",
    "JVPTrace",
    "JVPTracer",
    "as_manual_mesh",
    "check_vma",
    "current_trace",
    "dce_jaxpr",
    "extend_axis_env",
    "partial_eval_jaxpr_nounits",
    "primitive_jvps",
    "remat_allowed_effects",
    "trace_context",
    "user_frames",
]

user_frames = _source_info_util.user_frames
primitive_jvps = _ad.primitive_jvps
remat_allowed_effects = _effects.remat_allowed_effects
partial_eval_jaxpr_nounits = _pe.partial_eval_jaxpr_nounits
dce_jaxpr = _pe.dce_jaxpr
check_vma = _config._check_vma
extend_axis_env = _extend_axis_env
as_manual_mesh = _as_manual_mesh

try:  # where jax 0.4.36 to 0.12 keep them
    from jax._src.interpreters.ad import JVPTrace, JVPTracer
except ImportError:  # pragma: no cover - a jax that moved them: detect nothing rather than fail
    JVPTrace = JVPTracer = ()  # type: ignore[assignment,misc]
try:
    from jax._src.interpreters.partial_eval import DynamicJaxprTrace
except ImportError:  # pragma: no cover
    DynamicJaxprTrace = ()  # type: ignore[assignment,misc]


def trace_context() -> tuple:
    """The JAX configuration ``jax.jit`` keys its trace cache by; ``()`` on a JAX without it."""
    context: tuple = getattr(_config, "trace_context", tuple)()
    return context


def current_trace() -> Any:
    """The trace JAX is tracing the current call under; ``None`` on a JAX that keeps it elsewhere."""
    return getattr(getattr(_core, "trace_ctx", None), "trace", None)
