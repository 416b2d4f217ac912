"""Where an equation comes from: the user's source line.

Every node of a plan's graph names ``file:line`` of the user's code that made
its value (:func:`source_line`): the innermost frame of the equation's
traceback outside JAX and outside remat_opt, whose models in
:mod:`remat_opt.zoo` count as a user's code.

JAX caches the jaxpr of a jitted function (``jnp.where``, ``jnp.take``,
``jax.nn.softmax``'s helpers, the user's own ``jax.jit`` helpers) and records
its equations' tracebacks inside that function only, cut at the ``jit``
boundary. Inlined into the flat program, an equation of ``jnp.where``'s body
names no user line (docs/measurements.md, "The demo", for how many of the
zoo GPT's values did). When it names
none, :func:`at_call_site` gives it the traceback of the equation that called
it, whose line is the user's call.
"""

from __future__ import annotations

import os
from typing import Any

from jax.extend import core

from .._jax_private import user_frames

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ZOO = os.path.join(_PACKAGE, "zoo") + os.sep  # the zoo's models are a user's code


def _is_internal(file_name: str) -> bool:
    path = os.path.abspath(file_name)
    return path.startswith(_PACKAGE + os.sep) and not path.startswith(_ZOO)


def source_line(traceback: Any) -> str:
    """``"file:line"`` of the innermost frame of ``traceback`` outside JAX and
    remat_opt (the zoo's models count as the user's); ``""`` when there is none."""
    frames = user_frames(traceback)
    frame = next((f for f in frames if not _is_internal(f.file_name)), None)
    return f"{frame.file_name}:{frame.start_line}" if frame else ""


def at_call_site(eqn: core.JaxprEqn, caller: Any) -> core.JaxprEqn:
    """``eqn`` with the traceback ``caller`` (of the equation that called the
    jaxpr holding it) when its own names no user line and ``caller``'s does."""
    if caller is None or source_line(eqn.source_info.traceback) or not source_line(caller):
        return eqn
    return eqn.replace(source_info=eqn.source_info.replace(traceback=caller))
