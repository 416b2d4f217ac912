"""Whether this backend's XLA keeps a bare ``jax.checkpoint``'s recomputation in the backward.

JAX fences a checkpoint's recomputation from the forward with an ``optimization_barrier``.
jax 0.10's XLA:CPU expands the barrier away and merges the recomputation back into the
forward (docs/xla_findings.md §1); jax 0.12's XLA:CPU and XLA:TPU keep it. Where it is kept,
remat_opt's own fence (a ``lax.cond`` on the incoming cotangent,
:func:`remat_opt.rewrite._rewrite.fenced_checkpoint`) is not needed, and it costs: XLA cannot
fuse across a conditional, and jax 0.12.1's XLA:CPU miscompiles a layer norm's gradient
compiled as a branch of its own (docs/xla_findings.md §10).

The answer is read from the compiler, once per backend and process: a probe chain compiled
plain and with a checkpoint per layer.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp

from ._measure import memory_of

UNDONE = 0.75
"""A per-layer checkpoint that saves nothing but peaks above this share of the plain program's
peak may have been undone by the compiler."""

_LAYERS, _WIDTH, _HIDDEN, _BATCH = 8, 32, 128, 1024


def _probe_layer(w: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
    return x + jnp.tanh(jnp.tanh(x @ w[0]) @ w[1])


def _probe_peak(checkpointed: bool) -> int:
    """XLA's peak for the probe chain's gradient step on the default backend."""
    layer = (jax.checkpoint(_probe_layer, policy=jax.checkpoint_policies.nothing_saveable)
             if checkpointed else _probe_layer)

    def loss(ws: list, x: jax.Array) -> jax.Array:
        for w in ws:
            x = layer(w, x)
        return x.sum()

    f32 = jnp.float32
    ws = [(jax.ShapeDtypeStruct((_WIDTH, _HIDDEN), f32), jax.ShapeDtypeStruct((_HIDDEN, _WIDTH), f32))] * _LAYERS
    x = jax.ShapeDtypeStruct((_BATCH, _WIDTH), f32)
    return memory_of(jax.jit(jax.value_and_grad(loss)).lower(ws, x).compile())


def _honoured() -> bool:
    return _probe_peak(True) <= UNDONE * _probe_peak(False)


@functools.cache
def _honoured_on(backend: str) -> bool:
    # A thread of its own: the same fact whatever transformation or mesh context the caller
    # is tracing under (JAX keeps those per thread).
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_honoured).result()


def bare_checkpoints_honoured() -> bool:
    """Whether XLA on JAX's default backend keeps the recomputation of a bare ``jax.checkpoint``
    apart from the forward: a probe chain with a checkpoint per layer that saves nothing peaks
    at most :data:`UNDONE` of the same chain as written. Probed once per backend and process."""
    return _honoured_on(jax.default_backend())
