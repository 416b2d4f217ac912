"""The step-time search's candidates, and what this process measured of them.

A :class:`Candidate` is a program the search may return with the device's figures for it;
a :class:`TimedCall` is the call it plans. The search compiles and runs each candidate once per
function and argument signature in a process (:func:`measured_of`), and builds the program's
time graph once (:func:`time_graph_of`), so that a sweep of budgets measures each plan once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from .._plan import Timed
from ..memory._measure import per_function, signature
from ..memory._timing import Compiled
from ..program._cost import CostModel
from ..program._graph import ProgramGraph
from ..program._trace import TracedProgram
from ..rewrite._layers import LayerPlan, StagePolicy
from ..rewrite._loops import LoopPlan
from ..solve._layers import Layers
from ._saved_bytes import time_graph


def per_layer_plan(layers: Layers, per_layer: Sequence[StagePolicy], fenced: bool) -> LayerPlan:
    """The layer plan with ``per_layer[i]`` on layer ``i`` and the prefix and suffix as written."""
    policies: list[StagePolicy] = [None] * (len(layers.bounds()) - 1)
    for stage, policy in zip(layers.layer_stages(), per_layer):
        policies[stage] = policy
    return LayerPlan(layers.bounds(), tuple(policies), fenced)


@dataclass(frozen=True)
class Candidate:
    """A program the search may return, and what the device said of it."""

    label: str
    program: Callable[..., Any]
    layer_plan: LayerPlan | None = None
    loop_plan: LoopPlan | None = None
    compiled: Compiled | None = None
    step_seconds: float | None = None
    estimate: int | None = None

    @property
    def peak_bytes(self) -> int | None:
        return None if self.compiled is None else self.compiled.peak_bytes

    def figure(self) -> Timed:
        note = "" if self.compiled is None or self.compiled.error is None else self.compiled.error
        return Timed(self.label, self.peak_bytes, self.step_seconds, note, self.estimate)


@dataclass(frozen=True)
class TimedCall:
    """One call's program and arguments, as the step-time search needs them."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    argnums: tuple[int, ...]
    nums: Any
    has_aux: bool
    budget: int
    cost_model: CostModel | None = None
    repeats: int = 5


_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _per_call(store: weakref.WeakKeyDictionary, call: TimedCall) -> dict:
    """``store``'s dict for ``call.fn`` on these arguments (a fresh one each time for a function
    that cannot be weakly referenced). Kept while the function lives."""
    key = (signature(call.args, call.kwargs), repr(call.nums), call.has_aux, call.repeats, jax.default_backend())
    return per_function(store, call.fn).setdefault(key, {})


def measured_of(call: TimedCall) -> dict[str, tuple[Compiled, float | None, Candidate]]:
    """What this process measured of ``call.fn``'s candidates on these arguments, by label: each
    compile, its step time where one was run, and the candidate."""
    return _per_call(_MEASURED, call)


def time_graph_of(call: TimedCall, part: str, traced: TracedProgram) -> ProgramGraph:
    """:func:`remat_opt.planner._saved_bytes.time_graph` of ``traced`` (``part`` of ``call``'s
    program: ``"layers"``, the whole, or ``"body"``, its scan's body), built once per function and
    arguments in this process."""
    graphs = _per_call(_GRAPHS, call)
    if part not in graphs:
        graphs[part] = time_graph(traced)
    return graphs[part]
