"""Plans that put the whole function under ``jax.checkpoint`` with a built-in policy.

``jax.checkpoint(fn, policy=...)`` around the whole loss is the first plan a
user writes, and XLA can keep less for it than for ``fn`` as written without
recomputing anything: under ``everything_saveable`` the backward reads the
primal values the checkpoint saved, where plain differentiation keeps each
rule's own residuals. On an unrolled recurrent cell with layer norm and gelu
that was 8% under the plain peak (docs/measurements.md, "Whole-function
policies"). The memory model does not describe these programs (its trace sees
through the checkpoint), so they are measured, never predicted: in order of
recomputed FLOPs, only those cheaper than the plan already in hand, up to the
first that XLA fits.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._budget import format_bytes
from .memory._measure import gradient_flops
from .program._cost import CostModel
from .rewrite._policies import POLICIES, policy_program

logger = logging.getLogger("remat_opt")


@dataclass(frozen=True)
class PolicyCandidate:
    """``jax.checkpoint(fn, policy=POLICIES[policy])``, measured on XLA.

    Attributes:
        policy: a key of :data:`remat_opt.rewrite._policies.POLICIES`.
        program: ``fn`` under it (static leaves closed over, as ``eqx.filter_checkpoint``).
        flops: FLOPs it recomputes, counted on its gradient's jaxpr.
        measured: XLA's peak of its gradient step.
    """

    policy: str
    program: Callable[..., Any]
    flops: int
    measured: int


def counted_policies(fn: Callable[..., Any], args: tuple, kwargs: dict, nums: Any, cost_model: CostModel | None,
                     has_aux: bool, baseline_flops: int) -> list[PolicyCandidate]:
    """Every built-in policy around ``fn``, with the FLOPs it recomputes (not measured yet: ``measured`` 0)."""
    counted = []
    for name in POLICIES:
        program = policy_program(fn, name)
        flops = gradient_flops(program, args, kwargs, nums, cost_model, has_aux) - baseline_flops
        counted.append(PolicyCandidate(name, program, flops, 0))
    return sorted(counted, key=lambda c: (c.flops, c.policy))


def measured_policies(counted: list[PolicyCandidate], budget: int, measure: Callable[[Callable[..., Any]], int],
                      below_flops: int | None = None, above_flops: int = -1) -> list[PolicyCandidate]:
    """``counted`` measured on XLA, cheapest first, up to the first that fits ``budget``.

    Only those recomputing fewer FLOPs than ``below_flops`` (the plan in hand;
    ``None``: any) and more than ``above_flops`` (those measured before) are
    measured. Returns every one measured, the one that fits (if any) last.
    """
    measured = []
    for candidate in counted:
        if candidate.flops <= above_flops or (below_flops is not None and candidate.flops >= below_flops):
            continue
        peak = measure(candidate.program)
        logger.info("jax.checkpoint(fn, policy=%s): measured %s, %s FLOPs recomputed", candidate.policy,
                    format_bytes(peak), f"{candidate.flops:,}")
        measured.append(dataclasses.replace(candidate, measured=peak))
        if peak <= budget:
            break
    return measured
