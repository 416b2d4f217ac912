"""The plan: what was decided, what the model predicts, what XLA measured."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from . import _report
from ._budget import format_bytes
from ._schedule import Schedule, Simulation
from .memory._fragmentation import Fragmentation
from .memory._sharded import Collective
from .program._graph import ProgramGraph
from .rewrite._layers import LayerPlan
from .rewrite._loops import LoopPlan


@dataclass(frozen=True)
class Timed:
    """One candidate of the step-time search, as the device measured it.

    Attributes:
        label: what the candidate is (``"plain"``, a layer plan, a loop plan).
        peak_bytes: XLA's peak, ``None`` when XLA could not fit it into the device.
        step_seconds: the median step time on the device; ``None`` when not run
            (it did not fit the budget, or the device ran out of memory).
        note: why it has no figure (XLA's out-of-memory message), else ``""``.
        estimated_peak_bytes: the peak estimated before it was compiled, from the peaks of
            uniform per-layer plans measured first; ``None`` for a candidate given no estimate.
    """

    label: str
    peak_bytes: int | None
    step_seconds: float | None
    note: str = ""
    estimated_peak_bytes: int | None = None


@dataclass(frozen=True)
class Plan:
    """A checkpointing plan for one input signature, with its evidence.

    Predicted and measured figures are kept apart: ``predicted_peak_bytes`` is
    the memory model's, ``measured_peak_bytes`` is XLA's (``None`` only when it
    was not measured).

    Every strategy returns this type, the solver and each baseline
    (:mod:`remat_opt.baselines._baselines`) alike, so plans can be compared. A baseline
    that is a JAX checkpoint policy, not a schedule on the graph, has no model
    prediction (``predicted_peak_bytes`` and ``schedule`` are ``None``).

    Attributes:
        graph: one node per value of the differentiated forward program, with
            attributes ``primitive``, ``shape``, ``dtype``, ``bytes``, ``flops``,
            ``decision`` ("input", "output", "save", "recompute" or "free": used
            only in the forward), ``segment`` and ``source`` (the user's line);
            ``decision`` and ``segment`` are ``None`` when ``schedule`` is.
        budget_bytes: the budget asked for.
        predicted_peak_bytes: the model's peak for this plan; ``None`` for a
            strategy the model does not describe (a JAX checkpoint policy). For a plan of
            the step-time search, its estimate before it was compiled
            (:meth:`remat_opt.planner._timed._Search.estimate`), where it had one.
        measured_peak_bytes: XLA's peak (``remat_opt.peak_bytes``) for this plan.
        plain_peak_bytes: XLA's peak for the function as written.
        recompute_flops: FLOPs recomputed, by the model (for a strategy
            without a schedule, the measured figure). On a mesh, recomputed
            collectives count at ``collective_flops_per_byte``.
        measured_recompute_flops: FLOPs the rewritten program's jaxpr computes
            beyond the plain gradient's. Negative where it computes less: an
            unrolled scan drops work its loop could not (the cotangent of a
            first carry nothing differentiates).
        baseline_flops: FLOPs of the plain gradient (``jax.value_and_grad``).
        status: "OPTIMAL", "FEASIBLE" (see ``gap``), "PLAIN" (no remat needed)
            or "BASELINE" (a baseline strategy, not solved against the budget).
        gap: relative optimality gap of the recompute FLOPs (0 when optimal).
        solve_seconds: time in the CP-SAT solver, all attempts.
        attempts: solves needed until XLA confirmed the budget.
        schedule: the decisions (segment starts, saved names, nested segments);
            ``None`` for a strategy that is not a schedule on the graph (a JAX
            checkpoint policy). A nested schedule (or one of Chen's) is chosen by
            measurement among :func:`remat_opt.solve._nesting.nested_candidates` and
            Chen's segmentations: ``gap`` is then against the trivial bound 0.
        strategy: who made the plan ("remat_opt", or a baseline's name).
        jax_version: the jax version it was measured with.
        loop_plan: set when the program's scans are kept as loops and
            checkpointed as a whole (:class:`remat_opt.rewrite._loops.LoopPlan`, chosen by
            measurement among the plans users write by hand; ``recompute_flops``
            is then the measured figure, ``gap`` is against the trivial bound 0
            and ``graph`` is the loop program's); ``None`` when the plan is a
            ``schedule`` on the program as traced (scans unrolled).
        computed_once: stored values the rewritten program has XLA compute
            once (``optimize(..., compute_saved_once=True)``, the default; :mod:`remat_opt.memory._once`).
        segment_peaks: the model's peak during each segment's backward, in
            segment order (the backward runs them last to first); empty for
            a strategy the model does not describe.
        collective_bytes: on a mesh, the bytes the planned step's collectives
            move per device, as XLA compiled it (every all-gather, all-reduce,
            reduce-scatter, all-to-all and collective-permute, a conditional's
            branches included); ``None`` for a program on one device.
        plain_collective_bytes: the same for the step as written.
        collective_flops_per_byte: the FLOPs one collective byte cost the
            planner (:class:`remat_opt.Interconnect`); 0 off a mesh.
        collectives: on a mesh, each forward equation XLA lowered to a
            collective (an FSDP layer's weight gather) with the plan's decision
            on its value: saved, gathered again in the backward, or held
            (:class:`remat_opt.memory._sharded.Collective`).
        whole_policy: set when the plan is ``jax.checkpoint`` around the whole
            function with this built-in policy (a key of ``remat_opt.POLICIES``),
            chosen by measurement (:mod:`remat_opt.planner._policy_planning`); the model
            does not describe it (``predicted_peak_bytes`` is ``None``),
            ``recompute_flops`` is the measured figure and ``gap`` is against
            the trivial bound 0.
        layer_plan: set when the plan is a checkpoint per layer of the traced program, each
            layer under its own policy (:class:`remat_opt.rewrite._layers.LayerPlan`), chosen by
            the step-time search (status ``"TIMED"``).
        step_seconds: the plan's median step time on the device, where the step-time search
            ran it; ``None`` otherwise.
        plain_step_seconds: the same for the program as written, where it was run.
        timed: every candidate of the step-time search with its peak and step time, fastest
            first (empty for a plan not chosen by step time).
    """

    graph: nx.DiGraph = field(repr=False, compare=False)
    budget_bytes: int
    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    plain_peak_bytes: int | None
    recompute_flops: int
    measured_recompute_flops: int | None
    baseline_flops: int
    status: str
    gap: float
    solve_seconds: float
    attempts: int
    schedule: Schedule | None
    strategy: str = "remat_opt"
    jax_version: str = ""
    loop_plan: LoopPlan | None = None
    computed_once: int = 0
    segment_peaks: tuple[int, ...] = ()
    collective_bytes: int | None = None
    plain_collective_bytes: int | None = None
    collective_flops_per_byte: float = 0.0
    collectives: tuple[Collective, ...] = ()
    whole_policy: str | None = None
    layer_plan: LayerPlan | None = None
    step_seconds: float | None = None
    plain_step_seconds: float | None = None
    timed: tuple[Timed, ...] = ()

    @property
    def recompute_collective_bytes(self) -> int | None:
        """Collective bytes per device the plan moves beyond the step as written
        (an FSDP weight gathered again in the backward); ``None`` off a mesh."""
        if self.collective_bytes is None or self.plain_collective_bytes is None:
            return None
        return self.collective_bytes - self.plain_collective_bytes

    @property
    def num_segments(self) -> int | None:
        """Segments of the schedule's outer level; ``None`` when the plan has no schedule."""
        if self.schedule is None:
            return None
        return 1 if self.schedule.plain else len(self.schedule.cuts) + 1

    @property
    def recompute_overhead(self) -> float:
        """Recomputed FLOPs as a fraction of the plain gradient's FLOPs."""
        return self.recompute_flops / self.baseline_flops if self.baseline_flops else 0.0

    @property
    def fits(self) -> bool | None:
        """Whether XLA's measured peak is within the budget."""
        return None if self.measured_peak_bytes is None else self.measured_peak_bytes <= self.budget_bytes

    def report(self, fragmentation: Fragmentation | None = None) -> str:
        """A table per segment: the values saved and recomputed, their bytes and
        FLOPs, grouped by the user's source line (:func:`remat_opt._report.report`).

        Args:
            fragmentation: :func:`remat_opt.fragmentation` of the optimized
                function on the plan's arguments; when given, the report says
                how many bytes are live at XLA's peak of the planned step against
                those XLA allocated (planning itself compiles no such dump).

        Example:
            >>> print(plan.report(remat_opt.fragmentation(step, params, batch)))  # doctest: +SKIP
        """
        return _report.report(self, fragmentation)

    def to_dot(self, path: str | os.PathLike) -> Path:
        """Writes :attr:`graph` as Graphviz DOT, through networkx's pydot export
        (needs ``pydot``: ``pip install remat_opt[plot]``); nodes are coloured by
        decision and labelled with primitive, shape and source line. Returns the
        file's path, e.g. for ``dot -Tsvg``."""
        return _report.to_dot(self, path)

    def plot(self, path: str | os.PathLike | None = None) -> Any:
        """The model's peak per segment against the budget and XLA's measured
        peak, as a matplotlib ``Figure`` (needs matplotlib); saved to ``path`` when given."""
        return _report.plot(self, path)

    @property
    def status_text(self) -> str:
        """:attr:`status`, and for a feasible plan its gap: ``"FEASIBLE, gap 12.3%"``, or
        ``"FEASIBLE, no lower bound"`` where none above 0 is known (a gap of 100% says
        only that, not that the plan is poor: its recompute is measured, and compared
        with the baselines' by the tests and experiments)."""
        if self.status != "FEASIBLE":
            return self.status
        return "FEASIBLE, no lower bound" if self.gap >= 1.0 else f"FEASIBLE, gap {self.gap:.1%}"

    def __str__(self) -> str:
        measured = "not measured" if self.measured_peak_bytes is None else format_bytes(self.measured_peak_bytes)
        plain = "" if self.plain_peak_bytes is None else f" (plain {format_bytes(self.plain_peak_bytes)})"
        if self.status == "TIMED":
            status = "TIMED, the fastest candidate that fits, run on the device"
        elif self.status != "FEASIBLE":
            status = self.status
        elif self.loop_plan is not None:
            status = "FEASIBLE, the cheapest loop plan that fits (no lower bound)"
        elif self.whole_policy is not None:
            status = "FEASIBLE, the cheapest whole-function policy that fits (no lower bound)"
        elif self.schedule is not None and self.schedule.nested:
            status = "FEASIBLE, the cheapest nested schedule that fits (no lower bound)"
        else:
            status = self.status_text
        predicted = "none" if self.predicted_peak_bytes is None else format_bytes(self.predicted_peak_bytes)
        if self.layer_plan is not None:
            decisions = str(self.layer_plan)
        elif self.loop_plan is not None:
            decisions = str(self.loop_plan)
        elif self.whole_policy is not None:
            decisions = f"jax.checkpoint around the whole function, policy {self.whole_policy}"
        elif self.schedule is None:
            decisions = "not a schedule"
        else:
            decisions = f"{self.num_segments} segment(s), {len(self.schedule.saved)} value(s) saved by name"
            if self.schedule.nested:
                decisions += f", checkpoints nested {self.schedule.depth()} levels deep"
            if self.computed_once:
                decisions += f", {self.computed_once} stored value(s) computed once"
            if self.schedule.bare:
                decisions += ", bare checkpoints (this compiler honours them)"
        return (
            f"Plan[{self.strategy}] {status}: budget {format_bytes(self.budget_bytes)}, "
            f"predicted peak {predicted}, measured {measured}{plain}; {decisions}; "
            f"recompute {self.recompute_flops:,} FLOPs (+{self.recompute_overhead:.1%}); "
            f"solved in {self.solve_seconds:.2f}s, {self.attempts} attempt(s); jax {self.jax_version}"
            + self._time_summary()
            + self._collective_summary()
        )

    def _time_summary(self) -> str:
        """Where the step was timed: its step, against the plain program's, and of how many
        candidates of the step-time search (none where nothing of it fit, and the FLOP search's
        plan was timed instead)."""
        if self.step_seconds is None:
            return ""
        plain = "" if self.plain_step_seconds is None else f" (plain {1e3 * self.plain_step_seconds:.2f} ms)"
        among = f" on {len(self.timed)} candidate(s) measured" if self.timed else \
            " (none of the step-time search's candidates fit)"
        return f"; step {1e3 * self.step_seconds:.2f} ms{among}{plain}"

    def _collective_summary(self) -> str:
        """On a mesh: the collective bytes XLA counts, and per collective equation its decision."""
        if self.collective_bytes is None:
            return ""
        again = sum(c.bytes for c in self.collectives if c.decision == "repeated")
        head = (f"; recompute counts collectives at {self.collective_flops_per_byte:,.0f} FLOPs per byte "
                f"({self.measured_recompute_flops or 0:,} FLOPs on the jaxpr); collectives "
                f"{format_bytes(self.collective_bytes)} per device on XLA (plain "
                f"{format_bytes(self.plain_collective_bytes or 0)}), {format_bytes(again)} of them repeated by plan")
        return head + "".join(f"\n  {c}" for c in self.collectives)


Planned = tuple[Plan, Callable[..., Any]]
"""A plan and the rewritten function that runs it."""


def annotate(graph: ProgramGraph, sim: Simulation) -> nx.DiGraph:
    """The plan's networkx graph: the program graph with each value's decision."""
    g = graph.nx_graph()
    for v in range(graph.num_nodes):
        unit = graph.node_unit[v]
        if graph.is_output[v]:
            decision = "output"
        elif v in sim.stored_nodes:
            decision = "save"
        elif unit in sim.recomputed_units:
            decision = "recompute"
        else:
            decision = "free"
        g.nodes[v]["decision"] = decision
        g.nodes[v]["segment"] = sim.segment_of_position[graph.units[unit].position]
    for k in range(len(graph.input_labels)):
        g.nodes[graph.input_node(k)].update(decision="input", segment=None)
    return g


def measured_peak_of(plan: Plan) -> int:
    """``plan.measured_peak_bytes`` of a plan measured on XLA (as every plan the planner makes is)."""
    if plan.measured_peak_bytes is None:
        raise ValueError("the plan was not measured on XLA: it has no measured peak.")
    return plan.measured_peak_bytes


def measured_flops_of(plan: Plan) -> int:
    """``plan.measured_recompute_flops`` of a plan whose rewritten jaxpr was counted
    (as every plan the planner makes is)."""
    if plan.measured_recompute_flops is None:
        raise ValueError("the plan's rewritten program was not counted: it has no measured recompute FLOPs.")
    return plan.measured_recompute_flops
