"""The plan returned, compiled as the user's ``jax.jit`` will compile it.

Planning compiles its candidates for their figures only
(:data:`remat_opt.memory._compiles.FIGURES_ONLY`): XLA's buffer assignment is
made before the option it turns off is read, so the figures agree and each
compile costs less (docs/measurements.md, "Planning time: what a plan compiles"). The
judge is still the program the user runs, so the winner is compiled once more with the
default options, and that figure is the plan's. Should the two ever disagree, the plan
carries the default figure; if that is over the budget, the search runs again with every
candidate compiled the user's way, so a returned plan always fits on the compile that counts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from . import _progress as progress
from .._budget import format_bytes
from .._plan import Planned, measured_peak_of

logger = logging.getLogger("remat_opt")



def verified(planned: Planned, verify: Callable[[Callable[..., Any]], int], budget: int,
             search_again: Callable[[], Planned]) -> Planned:
    """``planned`` with its peak as ``verify`` (the default compile) measures it.

    Args:
        planned: the plan and its program, chosen on figures-only compiles.
        verify: XLA's peak of a program's gradient step, compiled as the user's jit compiles it.
        budget: the budget in bytes.
        search_again: the search with every candidate measured by ``verify``.
    """
    plan, program = planned
    progress.stage("compiling the plan as jax.jit will")
    peak = verify(program)
    if peak == plan.measured_peak_bytes:
        return planned
    logger.warning("the plan's peak compiled with default options is %s, not the %s its figures-only compile "
                   "gave%s", format_bytes(peak), format_bytes(measured_peak_of(plan)),
                   "" if peak <= budget else "; planning again with default compiles")
    if peak <= budget:
        return dataclasses.replace(plan, measured_peak_bytes=peak), program
    return search_again()
