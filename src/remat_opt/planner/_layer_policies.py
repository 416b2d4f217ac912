"""The per-layer policies a user writes by hand, as candidates of the FLOP search.

``jax.checkpoint(layer, policy=...)`` around every layer is the plan a JAX user
tries first. On XLA:CPU a bare one is undone (docs/xla_findings.md §1), so the
FLOP search weighs each built-in policy per layer behind the rewriter's fence,
on the layers found in the program itself (:func:`remat_opt.solve._layers.layers_of`):
counted on the gradient's jaxpr, measured on XLA only when it recomputes less
than the plan in hand, cheapest first, up to the first that fits. Each is then
a baseline the returned plan never recomputes more than, by measurement.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._budget import format_bytes
from ..cache._call import Call
from ._candidates import per_layer_plan
from ._timed import LADDER
from ..memory._measure import gradient_flops
from ..program._trace import TracedProgram, with_signature
from ..rewrite._layers import LayerPlan, layer_program
from ..solve._layers import layers_of

logger = logging.getLogger("remat_opt")


@dataclass(frozen=True)
class LayerPolicyCandidate:
    """Every layer under one built-in policy, fenced, with the FLOPs it recomputes and XLA's peak
    (``measured``: 0 until measured)."""

    plan: LayerPlan
    program: Callable[..., Any]
    flops: int
    measured: int = 0


def counted_layer_policies(call: Call, whole: TracedProgram, baseline_flops: int) -> list[LayerPolicyCandidate]:
    """Each policy of :data:`remat_opt.planner._timed.LADDER` on every layer of ``call.fn`` (traced as
    ``whole``), fenced, fewest FLOPs recomputed beyond ``baseline_flops`` first (counted on the call's
    gradient step by its cost model); none where the program has no repeated layers."""
    layers = layers_of(whole)
    if layers is None:
        return []
    counted = []
    for policy in LADDER:
        plan = per_layer_plan(layers, [policy] * layers.count, fenced=True)
        program = with_signature(call.fn, whole, layer_program(whole, plan))
        flops = gradient_flops(program, call.args, call.kwargs, call.nums, call.options.cost_model,
                               call.has_aux) - baseline_flops
        counted.append(LayerPolicyCandidate(plan, program, flops))
    return sorted(counted, key=lambda c: c.flops)


def cheapest_fitting(counted: list[LayerPolicyCandidate], budget: int, measure: Callable[[Callable[..., Any]], int],
                     below_flops: int | None) -> LayerPolicyCandidate | None:
    """The candidate recomputing the fewest FLOPs (fewer than ``below_flops``, if given) that XLA
    fits in ``budget``; measured cheapest first, up to the first that fits."""
    for candidate in counted:
        if below_flops is not None and candidate.flops >= below_flops:
            return None
        measured = dataclasses.replace(candidate, measured=measure(candidate.program))
        logger.info("%s: measured %s, %s FLOPs recomputed", measured.plan, format_bytes(measured.measured),
                    f"{measured.flops:,}")
        if measured.measured <= budget:
            return measured
    return None
