"""A schedule's plan with bare checkpoints, where the compiler honours them and XLA fits it.

The FLOP search plans and measures fenced segments (:mod:`remat_opt.rewrite._rewrite`): its
memory model is the one of a compiler that undoes a bare checkpoint (jax 0.10's XLA:CPU,
docs/xla_findings.md §1). Where the default backend's compiler honours one
(:func:`remat_opt.memory._barriers.bare_checkpoints_honoured`), the fence's conditional is
dead weight: XLA cannot fuse across it, and jax 0.12.1's XLA:CPU miscompiles a layer norm's
gradient compiled as a branch of its own (docs/xla_findings.md §10). So the chosen schedule
is compiled bare once more, as the user's jit compiles it, and the plan is the bare one when
that fits the budget; otherwise it stays fenced.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from . import _progress as progress
from .._budget import format_bytes
from .._plan import Planned
from .._schedule import Schedule
from ..memory._barriers import bare_checkpoints_honoured

logger = logging.getLogger("remat_opt")


def unfenced(planned: Planned, program_of: Callable[[Schedule], Callable[..., Any]],
             verify: Callable[[Callable[..., Any]], int], flops_of: Callable[[Callable[..., Any]], int],
             budget: int) -> Planned:
    """``planned`` with its schedule's segments bare, if that applies and XLA fits it in ``budget``.

    Applies to a plan of a schedule with segments (not the program as written, a loop plan, a
    whole-function policy or a per-layer plan) on a backend whose compiler honours a bare
    checkpoint. The bare plan carries its own peak (``verify``) and recomputed FLOPs
    (``flops_of``: the gradient's FLOPs, of which the plan's baseline is subtracted).
    """
    plan, _ = planned
    schedule = plan.schedule
    if (schedule is None or schedule.plain or schedule.bare or not schedule.cuts
            or plan.loop_plan is not None or plan.whole_policy is not None or plan.layer_plan is not None
            or not bare_checkpoints_honoured()):
        return planned
    bare = dataclasses.replace(schedule, bare=True)
    progress.stage("compiling the plan with bare checkpoints")
    program = program_of(bare)
    peak = verify(program)
    if peak > budget:
        logger.info("the plan with bare checkpoints peaks at %s, over the budget: its segments stay fenced",
                    format_bytes(peak))
        return planned
    flops = flops_of(program) - plan.baseline_flops
    return dataclasses.replace(plan, schedule=bare, measured_peak_bytes=peak, measured_recompute_flops=flops), program
