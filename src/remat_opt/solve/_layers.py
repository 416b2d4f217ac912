"""The layers of a flat program: where a per-layer ``jax.checkpoint`` would go.

A model written as a loop over layers traces to one run of equations
repeated once per layer. :func:`layers_of` finds that run on the jaxpr alone
(the equations' tokens, as :func:`remat_opt.solve._blocks.repeated_period`
reads them) and places the layer boundaries, within it, where the fewest
bytes cross: a pre-LN transformer's residual stream, not an attention score.
Unlike :func:`remat_opt.solve._blocks.find_blocks` it asks nothing of the memory
model: any cut is a correct place for a checkpoint, so the layers need only
look alike, and a value every layer reads (a mask, a shared weight) is fine.

The repeated run may hold two layers of different kinds (a ResNet stage: a
block that downsamples, then one that does not). Where cutting each repeat
in two, at a point no more bytes cross than at its start, gives pieces that
also match the equations before or after the run (the stage before, whose
blocks do not downsample), the layers are the pieces, however far they reach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from jax.extend import core

from ..program._cost import FlopCostModel
from ..program._trace import TracedProgram
from ._blocks import MIN_BLOCKS, _token, repeated_period


@dataclass(frozen=True)
class Layers:
    """The layers of a flat program of ``size`` equations: layer ``k`` is the equations
    ``cuts[k]:cuts[k + 1]``."""

    cuts: tuple[int, ...]
    size: int

    @property
    def count(self) -> int:
        return len(self.cuts) - 1

    def spans(self) -> tuple[tuple[int, int], ...]:
        """Each layer's ``(first equation, end)``."""
        return tuple(zip(self.cuts[:-1], self.cuts[1:]))

    def bounds(self) -> tuple[int, ...]:
        """Stage starts, then the end: the prefix (if any), each layer, the suffix (if any)."""
        return tuple(sorted({0, *self.cuts, self.size}))

    def layer_stages(self) -> tuple[int, ...]:
        """The indices, among the stages of :meth:`bounds`, of the layers."""
        first = 1 if self.cuts[0] > 0 else 0
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
    A run whose pieces reach further is cut into them (see the module docstring).
    Layers that hold less than a tenth of the program's FLOPs are none (a few repeated
    equations beside the ``lax.scan`` that holds the model's layers).
    """
    jaxpr = traced.jaxpr.jaxpr
    crossing = crossing_bytes(jaxpr)
    layers = _repeated(jaxpr, _token, crossing)
    if layers is None or 2 * _covered(layers) < len(jaxpr.eqns):
        coarse = _repeated(jaxpr, lambda e: e.primitive.name, crossing)
        if coarse is not None and (layers is None or _covered(coarse) > _covered(layers)):
            layers = coarse
    if layers is None:
        return None
    layers = _pieces(jaxpr, layers, crossing)
    flops = [FlopCostModel().eqn_flops(e) for e in jaxpr.eqns]
    held = sum(flops[layers.cuts[0]: layers.cuts[-1]])
    return layers if 10 * held >= sum(flops) else None  # not two multiplies beside a scan that does the work


def _covered(layers: Layers) -> int:
    return layers.cuts[-1] - layers.cuts[0]


def _repeated(jaxpr: core.Jaxpr, token: Callable[[core.JaxprEqn], str], crossing: np.ndarray) -> Layers | None:
    codes: dict[str, int] = {}
    found = repeated_period(np.array([codes.setdefault(token(e), len(codes)) for e in jaxpr.eqns], dtype=np.int64))
    if found is None:
        return None
    period, run_start, run = found

    def cost(phase: int) -> tuple[int, int, int]:  # the most layers, the fewest bytes at the cut, the latest
        return (-((run - phase) // period), int(crossing[run_start + phase]), -phase)

    phase = min(range(period), key=cost)
    count = (run - phase) // period
    if count < MIN_BLOCKS:
        return None
    start = run_start + phase
    return Layers(tuple(start + k * period for k in range(count + 1)), len(jaxpr.eqns))


def _pieces(jaxpr: core.Jaxpr, layers: Layers, crossing: np.ndarray) -> Layers:
    """``layers``, or each layer cut in two pieces where the pieces also match, by primitive,
    equations before or after the run: the cut, among those no more bytes cross than at the
    layer's start and that leave each piece a quarter of the layer or more, whose pieces reach
    furthest (see the module docstring)."""
    names = [e.primitive.name for e in jaxpr.eqns]
    lo, hi = layers.spans()[0]
    best, reach = layers, 0
    for q in sorted(range(1, hi - lo), key=lambda q: (int(crossing[lo + q]), abs(2 * q - hi + lo))):
        if crossing[lo + q] > crossing[lo] or 4 * min(q, hi - lo - q) < hi - lo:  # two layers, not a sliver
            continue
        templates = (tuple(names[lo: lo + q]), tuple(names[lo + q: hi]))
        cuts = [c + a for c in layers.cuts[:-1] for a in (0, q)] + [layers.cuts[-1]]
        head: list[int] = []
        while (piece := _match(names, (head or cuts)[0], templates, backward=True)):
            head.insert(0, (head or cuts)[0] - piece)
        tail: list[int] = []
        while (piece := _match(names, (tail or cuts)[-1], templates, backward=False)):
            tail.append((tail or cuts)[-1] + piece)
        extra = (cuts[0] - (head or cuts)[0]) + ((tail or cuts)[-1] - cuts[-1])
        if extra > reach:
            best, reach = Layers(tuple(head + cuts + tail), layers.size), extra
    return best


def _match(names: list[str], at: int, templates: tuple[tuple[str, ...], ...], backward: bool) -> int:
    """The length of a template the equations just before (or from) ``at`` spell; 0 for none."""
    for t in sorted(templates, key=len, reverse=True):
        window = names[at - len(t): at] if backward else names[at: at + len(t)]
        if len(window) == len(t) and tuple(window) == t:
            return len(t)
    return 0
