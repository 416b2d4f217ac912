"""How long the FLOP search may run after the step-time search found nothing that fits.

On an accelerator the step-time search (:mod:`remat_opt.planner._timed`) plans first; where none
of its per-layer or per-body candidates fits the budget, the FLOP search's schedules, which reach
lower where the memory model is right, are tried next. Where the model is wrong about a program on
a device, they reach no lower, and each of the many compiles the FLOP search makes before it
refuses costs seconds to tens of seconds there. :class:`Patience` counts the compiles: once
``limit`` in a row have measured no new low below the step-time search's least peak, the search is
given up (:class:`Stalled`) and the budget refused, naming the lowest peak measured by either.
Once one of them fits the budget, the search has a plan and runs to its end.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from typing import Any

from .._budget import format_bytes
from .._errors import InfeasibleBudgetError
from ._search_state import Measure

logger = logging.getLogger("remat_opt")


class Stalled(Exception):
    """The FLOP search gave up: ``misses`` compiles in a row measured no lower than ``lowest``."""

    def __init__(self, lowest: int, misses: int) -> None:
        super().__init__(f"{misses} compiles in a row measured no lower than {lowest} bytes")
        self.lowest = lowest
        self.misses = misses

    def refusal(self, refused: InfeasibleBudgetError) -> InfeasibleBudgetError:
        """``refused`` (the step-time search's refusal), naming the lower of its peak and this
        search's lowest, and saying that the FLOP search stopped."""
        detail = (f"The FLOP search's schedules were measured too, and stopped after {self.misses} "
                  f"compiles in a row reached no lower.")
        if self.lowest < refused.min_budget_bytes:
            return InfeasibleBudgetError(refused.budget_bytes, self.lowest, detail)
        return InfeasibleBudgetError(refused.budget_bytes, refused.min_budget_bytes,
                                     " ".join(d for d in (refused.detail, detail) if d), refused.schedule)


@dataclasses.dataclass
class Patience:
    """A count of compiles that reach no new low.

    Attributes:
        budget: the budget planned for, in bytes: once a peak fits it, nothing is counted.
        floor: the least peak measured before (the step-time search's), in bytes.
        limit: compiles in a row allowed with no peak below ``floor`` and below every peak since.
        lowest: the least peak measured through :meth:`watch` so far.
        misses: compiles in a row with no new low.
    """

    budget: int
    floor: int
    limit: int
    lowest: int = sys.maxsize
    misses: int = 0

    def watch(self, measure: Measure) -> Measure:
        """``measure``, counting: raises :class:`Stalled` at the ``limit``-th miss in a row,
        unless a peak measured so far fits the budget."""
        def watched(program: Callable[..., Any]) -> int:
            peak = measure(program)
            new_low = peak < min(self.floor, self.lowest)
            self.lowest = min(self.lowest, peak)
            if self.lowest <= self.budget:
                return peak
            self.misses = 0 if new_low else self.misses + 1
            if self.misses >= self.limit:
                logger.info("FLOP search: %d compiles in a row no lower than %s: stopped", self.misses,
                            format_bytes(min(self.floor, self.lowest)))
                raise Stalled(self.lowest, self.misses)
            return peak
        return watched
