"""What one search of a call carries: the program as modelled, the search's shared figures, and
what a candidate measured. The planner (:mod:`remat_opt.planner._optimize`) passes these instead of loose
parameters; :mod:`remat_opt.planner._refusal` reads them for the error when nothing fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .._errors import InfeasibleBudgetError
from .._plan import Planned
from ..cache._call import Call
from ..program._graph import ProgramGraph
from ..program._trace import TracedProgram

Measure = Callable[[Callable[..., Any]], int]


@dataclasses.dataclass(frozen=True)
class Modelled:
    """A call's program as the search plans it, before anything is measured.

    Attributes:
        traced: the program planned (scans unrolled up to ``unroll_scans``, a shard_map's body).
        whole: ``fn`` as written, its scans whole: what a plain plan and the loop plans run.
        graph: the model's graph of ``traced``, with XLA's facts and, on a mesh, one device's bytes.
        compiled: XLA's account of ``fn`` as written (``None`` with ``xla_facts=False``).
        key: the program's key at any budget (:mod:`remat_opt.cache._lowest`, :mod:`remat_opt.cache._front`).
    """

    traced: TracedProgram
    whole: TracedProgram
    graph: ProgramGraph
    compiled: Any
    key: str


@dataclasses.dataclass
class Attempts:
    """What a search's strategies tried besides the plan they return: the seconds CP-SAT spent,
    and, for the error when nothing fits (:mod:`remat_opt.planner._refusal`), what each measured.

    Attributes:
        policies: JAX's whole-function policies, their FLOPs counted (measured as strategies need them).
        measured_policies: the whole-function policies measured, in order.
        loops: the loop plans measured or counted.
        infeasible: CP-SAT's search's refusal, where it found nothing that fits.
        lowest_other: the lowest-memory schedule outside CP-SAT's search measured, if any.
        solve_seconds: seconds every solve of the search took, whichever plan wins.
    """

    policies: list[Any] = dataclasses.field(default_factory=list)
    measured_policies: list[Any] = dataclasses.field(default_factory=list)
    loops: list[Any] = dataclasses.field(default_factory=list)
    infeasible: InfeasibleBudgetError | None = None
    lowest_other: Planned | None = None
    solve_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Search:
    """One search of a call: what every strategy is built, measured and judged with.

    Attributes:
        call: the question.
        model: the program, as modelled.
        graph: ``model.graph`` calibrated on XLA's peak of the flat program as written.
        whole_graph: the graph of ``fn`` as written (scans whole), calibrated on its peak.
        measure: XLA's peak of a program's gradient step.
        baseline_flops: FLOPs of the plain gradient step.
        plain_peak: XLA's peak of ``fn`` as written.
        attempts: what the strategies tried, filled in as they run.
    """

    call: Call
    model: Modelled
    graph: ProgramGraph
    whole_graph: ProgramGraph
    measure: Measure
    baseline_flops: int
    plain_peak: int
    attempts: Attempts = dataclasses.field(default_factory=Attempts)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a candidate measured on XLA, and how it was found.

    Attributes:
        peak: XLA's peak of its gradient step.
        flops: the FLOPs it recomputes, counted on its jaxpr (``None``: not counted).
        status, gap: the solver's (``"FEASIBLE"`` and 1: no bound, a schedule found outside CP-SAT).
        seconds: seconds in CP-SAT.
        attempts: solves, or candidates measured, until it fit.
    """

    peak: int
    flops: int | None = None
    status: str = "FEASIBLE"
    gap: float = 1.0
    seconds: float = 0.0
    attempts: int = 1

    @classmethod
    def counted(cls, peak: int, flops: int, seconds: float = 0.0) -> Outcome:
        """A measured candidate the solver did not bound: optimal when it recomputes nothing."""
        status, gap = ("FEASIBLE", 1.0) if flops > 0 else ("OPTIMAL", 0.0)
        return cls(peak, flops, status, gap, seconds)
