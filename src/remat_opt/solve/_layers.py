"""The layers of a flat program: where a per-layer ``jax.checkpoint`` would go.

A model written as a loop over layers traces to one run of equations
repeated once per layer. :func:`layers_of` finds that run on the jaxpr alone
(the equations' tokens, as :func:`remat_opt.solve._blocks.repeated_period`
reads them) and places the layer boundaries, within it, where the fewest
bytes cross: a pre-LN transformer's residual stream, not an attention score.
Unlike :func:`remat_opt.solve._blocks.find_blocks` it asks nothing of the memory
model: any cut is a correct place for a checkpoint, so the layers need only
look alike, and a value every layer reads (a mask, a shared weight) is fine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from jax.extend import core

from ..program._trace import TracedProgram
from ._blocks import MIN_BLOCKS, _token, repeated_period


@dataclass(frozen=True)
class Layers:
    """``count`` layers of ``length`` equations from equation ``start`` of a program of ``size``."""

    start: int
    length: int
    count: int
    size: int

    def bounds(self) -> tuple[int, ...]:
        """Stage starts, then the end: the prefix (if any), each layer, the suffix (if any)."""
        inner = [self.start + k * self.length for k in range(self.count + 1)]
        return tuple(sorted({0, *inner, self.size}))

    def layer_stages(self) -> tuple[int, ...]:
        """The indices, among the stages of :meth:`bounds`, of the layers."""
        first = 1 if self.start > 0 else 0
        return tuple(range(first, first + self.count))


def _nbytes(aval: object) -> int:
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    except TypeError:  # an extended dtype (a PRNG key): its size is not the point here
        return 0


def crossing_bytes(jaxpr: core.Jaxpr) -> np.ndarray:
    """Per position ``p`` (``0..len(eqns)``), the bytes of values made before equation ``p``
    and read at or after it (the program's outputs are read at the end)."""
    n = len(jaxpr.eqns)
    made: dict = {}
    last: dict = {}
    for p, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, core.Var) and v in made:
                last[v] = p
        for v in eqn.outvars:
            made[v] = p
    for v in jaxpr.outvars:
        if isinstance(v, core.Var) and v in made:
            last[v] = n
    delta = np.zeros(n + 2, dtype=np.int64)
    for v, p in made.items():
        if v in last and last[v] > p:
            delta[p + 1] += _nbytes(v.aval)
            delta[last[v] + 1] -= _nbytes(v.aval)
    return np.cumsum(delta)[: n + 1]


def layers_of(traced: TracedProgram) -> Layers | None:
    """The repeated layers of ``traced``'s flat program, or ``None`` where no run of
    equations repeats :data:`remat_opt.solve._blocks.MIN_BLOCKS` times.

    Equations are compared whole first (primitive, parameters, shapes); where that
    repetition covers less than half the program (a ResNet's stages change width),
    by primitive alone, which finds the layers that differ only in their shapes.
    """
    jaxpr = traced.jaxpr.jaxpr
    crossing = crossing_bytes(jaxpr)
    layers = _repeated(jaxpr, _token, crossing)
    if layers is None or 2 * layers.count * layers.length < len(jaxpr.eqns):
        coarse = _repeated(jaxpr, lambda e: e.primitive.name, crossing)
        if coarse is not None and (layers is None or coarse.count * coarse.length > layers.count * layers.length):
            layers = coarse
    return layers


def _repeated(jaxpr: core.Jaxpr, token: Callable[[core.JaxprEqn], str], crossing: np.ndarray) -> Layers | None:
    codes: dict[str, int] = {}
    found = repeated_period(np.array([codes.setdefault(token(e), len(codes)) for e in jaxpr.eqns], dtype=np.int64))
    if found is None:
        return None
    period, run_start, run = found

    def cost(phase: int) -> tuple[int, int, int]:  # the most layers, then the fewest bytes at the cut
        return (-((run - phase) // period), int(crossing[run_start + phase]), phase)

    phase = min(range(period), key=cost)
    count = (run - phase) // period
    if count < MIN_BLOCKS:
        return None
    return Layers(run_start + phase, period, count, len(jaxpr.eqns))
