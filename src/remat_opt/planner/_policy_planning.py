"""Plans that put the whole function under ``jax.checkpoint`` with a built-in policy.

``jax.checkpoint(fn, policy=...)`` around the whole loss is the first plan a
user writes, and XLA can keep less for it than for ``fn`` as written without
recomputing anything: under ``everything_saveable`` the backward reads the
primal values the checkpoint saved, where plain differentiation keeps each
rule's own residuals. An unrolled recurrent cell with layer norm and gelu
peaked under the plain peak on jax 0.10, an MLP with dropout on jax 0.12
(docs/measurements.md, "Whole-function policies as candidates"): which
programs gain is XLA's choice. The memory model does not describe these
programs (its trace sees through the checkpoint), so they are measured, never
predicted: in order of recomputed FLOPs, only those cheaper than the plan
already in hand, up to the first that XLA fits. The model still ranks them: a
policy is measured only when the model puts its nearest schedule
(:func:`nearest_schedule`) within reach of the budget, as the planner's other
outside candidates are; around the whole function the backward recomputes
every value it does not save before it transposes any, so these usually peak
near the program as written. Before a budget is refused, the policies the model put out
of reach are measured too (:func:`unmeasured_policies`): each is a baseline, so the
error's minimum is no higher than any of them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._budget import format_bytes
from ..cache._call import Call
from ..cache._counted import counted_flops
from .._schedule import Schedule
from ..memory._measure import gradient_flops
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ..rewrite._policies import POLICIES, policy_program
from ..solve._policy_saves import dot_names

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


def counted_policies(call: Call, baseline_flops: int, key: str | None = None) -> list[PolicyCandidate]:
    """Every built-in policy around ``call.fn`` JAX can differentiate, with the FLOPs it recomputes
    beyond ``baseline_flops`` on the call's gradient step, counted by its cost model (not measured
    yet: ``measured`` 0), each count kept under ``key`` (:mod:`remat_opt.cache._counted`).
    A saving policy fails on a program whose residuals include a complex value (JAX's
    ``reduce_precision`` on them rejects it); it is left out."""
    counted = []
    for name in POLICIES:
        program = policy_program(call.fn, name)
        try:
            flops = counted_flops(key, name, functools.partial(gradient_flops, program, call.args, call.kwargs,
                                                               call.nums, call.options.cost_model,
                                                               call.has_aux)) - baseline_flops
        except TypeError as err:
            logger.info("jax.checkpoint(fn, policy=%s) left out: %s", name, str(err).splitlines()[0])
            continue
        counted.append(PolicyCandidate(name, program, flops, 0))
    return sorted(counted, key=lambda c: (c.flops, c.policy))


def nearest_schedule(graph: ProgramGraph, policy: str) -> Schedule | None:
    """The schedule closest to ``jax.checkpoint(fn, policy=...)`` that the model
    describes: one fenced segment over all but the last equation, saving the
    values the policy saves (none; the dots' outputs, with or without batch
    dimensions). ``None`` for ``everything_saveable``, whose effect is XLA's
    choice of residuals, which the model does not know."""
    saved = {"nothing_saveable": frozenset(), "dots_saveable": dot_names(graph),
             "dots_with_no_batch_dims_saveable": dot_names(graph, batch_dims=False)}
    if policy not in saved or graph.num_positions < 2:
        return None
    return Schedule(cuts=frozenset({graph.num_positions - 1}), saved=saved[policy])


def within_reach(graph: ProgramGraph, policy: str, budget: int, slack: float) -> bool:
    """Whether the model puts ``policy`` around the whole function (its
    :func:`nearest_schedule`) within ``slack`` (a share) of ``budget``; a policy
    the model does not describe always is."""
    schedule = nearest_schedule(graph, policy)
    return schedule is None or simulate(graph, schedule).peak_bytes <= budget * (1 + slack)


def measured_policies(counted: list[PolicyCandidate], budget: int, measure: Callable[[Callable[..., Any]], int],
                      below_flops: int | None = None, above_flops: int = -1,
                      admit: Callable[[str], bool] = lambda policy: True) -> list[PolicyCandidate]:
    """``counted`` measured on XLA, cheapest first, up to the first that fits ``budget``.

    Only those recomputing fewer FLOPs than ``below_flops`` (the plan in hand;
    ``None``: any) and more than ``above_flops`` (those measured before), and
    whose policy ``admit`` lets through, are measured. Returns every one
    measured, the one that fits (if any) last.
    """
    measured = []
    for candidate in counted:
        if candidate.flops <= above_flops or (below_flops is not None and candidate.flops >= below_flops):
            continue
        if not admit(candidate.policy):
            continue
        peak = measure(candidate.program)
        logger.info("jax.checkpoint(fn, policy=%s): measured %s, %s FLOPs recomputed", candidate.policy,
                    format_bytes(peak), f"{candidate.flops:,}")
        measured.append(dataclasses.replace(candidate, measured=peak))
        if peak <= budget:
            break
    return measured


def unmeasured_policies(counted: list[PolicyCandidate], measured: list[PolicyCandidate], budget: int,
                        measure: Callable[[Callable[..., Any]], int]) -> list[PolicyCandidate]:
    """Before a budget is refused: the policies of ``counted`` not in ``measured`` (the model
    put them out of reach), measured as :func:`measured_policies` does. The model can be
    wrong about them, and each is a baseline: a budget one fits is not to be refused, and
    the error names a minimum no higher than any of their peaks."""
    done = {c.policy for c in measured}
    return measured_policies([c for c in counted if c.policy not in done], budget, measure)
