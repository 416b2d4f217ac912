"""The least any gradient step of a program holds: its arguments and its outputs.

XLA's peak is argument + output + temp − alias bytes (:mod:`remat_opt.memory._measure`).
Checkpointing changes only the temporaries: every rewritten step takes the same
arguments (parameters and inputs) and returns the same outputs (the loss, its aux
and the gradients), and nothing is donated, so nothing aliases. A budget under
their bytes is out of reach whatever is recomputed, and is refused before anything
is solved or compiled (a search would spend minutes proving it).

The bytes are read from the traced gradient step (one trace, no compile), counting
only what ``jax.jit`` hands XLA: arguments the step reads (unused ones are pruned),
and outputs it computes (not an argument returned as is, nor a constant such as
the zero gradient of an unused parameter). So the figure is at most XLA's
argument + output bytes, and a budget at or above it is never refused here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.extend import core

from .._budget import format_bytes
from .._errors import InfeasibleBudgetError
from ..cache._call import Call
from ..memory._measure import traced_step
from ..memory._sharded import is_sharded


@dataclasses.dataclass(frozen=True)
class Floor:
    """What every gradient step of a program holds at its peak, in bytes.

    Attributes:
        arguments: the arguments the step reads (parameters and inputs).
        outputs: the outputs it computes (loss, aux, gradients).
    """

    arguments: int
    outputs: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs


def _bytes(var: Any) -> int:
    aval = var.aval
    try:
        return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
    except (AttributeError, TypeError):  # a token, a PRNG key's extended dtype: counted as nothing
        return 0


def floor_of(jaxpr: core.Jaxpr) -> Floor:
    """The arguments read and the outputs computed by ``jaxpr`` (a gradient step's), in bytes."""
    needed = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    for eqn in reversed(jaxpr.eqns):  # jax.jit prunes the arguments nothing live reads
        if eqn.effects or any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if isinstance(v, core.Var))
    constant: set = set()  # computed from literals alone: XLA may fold them away
    for eqn in jaxpr.eqns:
        if not eqn.effects and all(not isinstance(v, core.Var) or v in constant for v in eqn.invars):
            constant.update(eqn.outvars)
    inputs = set(jaxpr.invars)
    outputs = {v for v in jaxpr.outvars if isinstance(v, core.Var) and v not in inputs and v not in constant}
    return Floor(sum(_bytes(v) for v in jaxpr.invars if v in needed), sum(_bytes(v) for v in outputs))


def floor_refusal(call: Call) -> InfeasibleBudgetError | None:
    """The error for ``call``'s budget where it is under the arguments and outputs of its
    gradient step, else ``None``. Not judged on a mesh (there the budget is one device's)."""
    if is_sharded(call.args, call.kwargs):
        return None
    floor = floor_of(traced_step(call.fn, call.args, call.kwargs, call.nums, call.has_aux).jaxpr.jaxpr)
    budget = call.budget
    if budget >= floor.total:
        return None
    detail = (f"(Arguments read: {format_bytes(floor.arguments)}; outputs computed: "
              f"{format_bytes(floor.outputs)}.)")
    return InfeasibleBudgetError(budget, floor.total, detail=detail, lower_bound=True)
