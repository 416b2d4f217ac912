"""The step-time search: on an accelerator, the fastest plan that fits, as the device runs it.

What a plan costs on a TPU or GPU is its step time, and the plans users weigh
it against are one line each: ``jax.checkpoint(layer, policy=...)`` around
every layer, or nothing at all (and XLA's own rematerialization). This search
starts from those lines, found on the traced program rather than in the
user's code, and then goes between them:

1. **Candidates.** The program as written; a checkpoint per layer
   (:func:`remat_opt.solve._layers.layers_of`) under each built-in policy in
   :data:`LADDER`; for a program whose layers are a ``lax.scan``, the same
   policies on the scan body (:class:`remat_opt.rewrite._loops.LoopPlan`), and
   each name recipe (MaxText's) on the ``checkpoint_name``s the body carries.
2. **Measure.** Each is compiled (in parallel) for XLA's peak; one that XLA
   cannot fit into the device does not fit. If the per-layer checkpoint that
   saves nothing lowers the peak of the program as written by little, the
   compiler may have undone it (XLA:CPU, docs/xla_findings.md §1): the layer
   candidates are then fenced too (:func:`remat_opt.rewrite._rewrite.fenced_checkpoint`)
   and compiled with the next round, and if the fenced family's least-memory
   plan XLA measures lower, steps 3 and 4 run again on it.
   Every candidate at or under the budget is run on the device.
3. **Between the lines.** Where the fastest fitting per-layer policy leaves
   room under the budget, its last ``k`` layers take the next policy up the
   ladder (they save more, and recompute less), ``k`` as large as XLA's
   measured peaks of the two uniform plans say fits; and its last layer runs
   as written.
4. **Saved by time.** Built-in policies save by kind (every matmul, or
   none), but on an accelerator recomputing a softmax over ``seq x seq``
   scores costs more time than recomputing a projection. Each layer instead
   saves the values a CP-SAT model chooses for the least *time*
   (:func:`remat_opt.solve._stage_saves.layer_saves`: each unit run again priced by
   :class:`remat_opt.program._roofline.RooflineCostModel` at the ridge the
   device is measured to have, each value kept by its write and read,
   :func:`remat_opt.planner._saved_bytes.store_costs`), in the bytes the budget leaves above the
   least-memory per-layer plan (read as XLA's bytes through the measured
   peaks of the per-layer dot policies), and in shares of those bytes
   (:data:`remat_opt.planner._saved_bytes.CAP_SHARES`).

5. **Nested.** Where every layer under the least-memory policy does not fit, the same layers in
   groups, each group under one more checkpoint that saves nothing (:meth:`_Search.nested`):
   the forward keeps a group's input, not each layer's. Compiled with steps 3 and 4.

Before it is compiled, each per-layer candidate of steps 3 and 4 is given an estimate of XLA's
peak, from the peaks step 2 measured (:meth:`_Search.estimate`); one estimated clearly over the
budget (:data:`OVER_ESTIMATE`) is not compiled, and the returned plan's ``predicted_peak_bytes`` is
its estimate. Of the rest, :data:`BETWEEN_COMPILES` are compiled together (:meth:`_Search.cheapest`:
those the time model prices lowest, one of them estimated well under the budget), and run where
they fit: each compile costs about one of the plain step, and the device, not the model, says
which is faster.

The fastest candidate that fits is the plan, among these and every candidate this process
measured for the same function and arguments at other budgets (so that a larger budget is never
answered by a slower plan). Its figures are the device's: a
guarantee that holds by measurement (the plan fits and was the fastest
measured), not a prediction of a model.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _progress as progress
from .._budget import format_bytes
from .._errors import InfeasibleBudgetError, InvalidBudgetError
from .._options import device_memory
from .._plan import Plan, annotate
from .._schedule import Schedule
from ..memory._barriers import UNDONE
from ..memory._facts import model_graph
from ..memory._measure import gradient_flops
from ..memory._simulate import simulate
from ..memory._timing import Compiled, compile_steps, run_inputs, step_seconds
from ..program._trace import TracedProgram, trace, with_signature
from ..rewrite._layers import StagePolicy, layer_program
from ..rewrite._loops import LoopPlan, loop_program, planned_scans, recipe_candidates, user_names
from ..program._scan_body import scan_body
from ..solve._body import choose_saved
from ..solve._layers import Layers, layers_of
from ..solve._solve import SolverOptions
from ..solve._stage_saves import layer_names, layer_saves
from ._candidates import Candidate, TimedCall, measured_of, per_layer_plan, time_graph_of
from ._saved_bytes import (dot_bytes, layer_bytes, layer_cost, policy_saves, saving_caps, store_costs,
                           xla_bytes_per_model_byte)

logger = logging.getLogger("remat_opt")

LADDER: tuple[StagePolicy, ...] = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")
"""Per-layer policies from the least memory (and the most recompute) to the most."""

BODY_SOLVER = SolverOptions(time_limit_s=10.0, deterministic_time_limit=2.0)
"""CP-SAT's limits for a scan body's saved set: a body is one layer, solved in well under a second."""

OVER_ESTIMATE = 1.1
"""A candidate whose estimated peak (:meth:`_Search.estimate`) is above this share of the budget is
not compiled. The estimate adds per-layer shares of peaks XLA measured, as if each layer's cost
were its own, so only a candidate clearly over the budget is dropped (its accuracy on the TPU:
docs/measurements.md, "After the session-45 runs")."""

BETWEEN_COMPILES = 2
"""How many of the plans between the one-line ones (steps 3 and 4 of the module docstring) are
compiled: those the time model prices lowest (:meth:`_Search.cheapest`). Each compile costs about
as much as the plain step's; the device, not the model, then ranks the few compiled."""

SAFE = 0.9
"""The share of the budget under which :meth:`_Search.cheapest` wants one pick estimated, so that a
candidate likely to fit is compiled though the lowest priced may not fit (the estimate's error on
the TPU: docs/measurements.md, "Step time on a TPU v5e")."""



def timed_plan(call: TimedCall) -> tuple[Plan, Callable[..., Any]]:
    """The fastest candidate that fits ``call.budget`` (see the module docstring).

    Raises:
        InfeasibleBudgetError: no candidate fits; the error names the lowest peak XLA measured.
    """
    started = time.perf_counter()
    traced = trace(call.fn, call.args, call.kwargs, call.argnums)
    layers = layers_of(traced)
    search = _Search(call, traced, layers)
    first = search.measure([Candidate("plain", call.fn), *search.uniform(fenced=False), *search.loops()])
    # The fenced layers, if the compiler may have undone the bare ones, beside the bare family's next round.
    fenced = search.uniform(fenced=True) if search.maybe_undone(first) else []
    nested = search.nested(first, fenced=False) + (search.nested(first, fenced=True) if fenced else [])
    tried = first + search.measure(search.cheapest(search.within_reach(search.between(first)
                                                                       + search.saves_by_time(first)))
                                   + search.body_saves_by_time(first) + fenced + nested)
    if fenced:
        search.choose_family(tried)
        if search.fenced:  # its own next round
            tried += search.measure(search.cheapest(search.within_reach(search.between(tried)
                                                                        + search.saves_by_time(tried))))
    tried += search.measure(search.recalled(tried))
    fitting = [c for c in tried if c.step_seconds is not None]
    if not fitting:
        raise _nothing_fits(call.budget, tried)
    best = min(fitting, key=lambda c: c.step_seconds or 0.0)
    logger.info("step-time search: %d candidates, %d fit; fastest %s, %.2f ms", len(tried), len(fitting),
                best.label, 1e3 * (best.step_seconds or 0.0))
    return _plan(call, traced, best, first[0], tried, time.perf_counter() - started), best.program


def with_step_time(call: TimedCall, planned: tuple[Plan, Callable[..., Any]]) -> tuple[Plan, Callable[..., Any]]:
    """``planned`` (a plan of another search) with its median step time on the device."""
    plan, program = planned
    compiled = compile_steps([program], call.args, call.kwargs, call.nums, call.has_aux)[0]
    if compiled.executable is None:  # XLA fit it at planning: only a device that changed refuses it now
        return planned
    seconds = step_seconds(compiled, run_inputs(call.fn, call.args, call.kwargs, call.nums, call.has_aux,
                                                compiled.step_args), call.repeats)
    return dataclasses.replace(plan, step_seconds=seconds), program


class _Search:
    """The candidates of one call, built on its traced program and measured on the device."""

    def __init__(self, call: TimedCall, traced: TracedProgram, layers: Layers | None):
        self.call, self.traced, self.layers = call, traced, layers
        self.fenced = False
        self._inputs: tuple | None = None

    def layer_candidate(self, per_layer: Sequence[StagePolicy], label: str, fenced: bool,
                        estimate: float | None = None, groups: tuple[tuple[int, int], ...] = ()) -> Candidate:
        assert self.layers is not None
        plan = dataclasses.replace(per_layer_plan(self.layers, per_layer, fenced), groups=groups)
        program = with_signature(self.call.fn, self.traced, layer_program(self.traced, plan))
        return Candidate(label + (" (fenced)" if fenced else ""), program, layer_plan=plan,
                         estimate=None if estimate is None else round(estimate))

    def within_reach(self, candidates: list[Candidate]) -> list[Candidate]:
        """``candidates`` but those estimated above :data:`OVER_ESTIMATE` of the budget."""
        limit = OVER_ESTIMATE * self.call.budget
        kept = [c for c in candidates if c.estimate is None or c.estimate <= limit]
        for c in candidates:
            if c not in kept:
                logger.info("candidate %s: estimated at %s, over the budget: not compiled", c.label,
                            format_bytes(c.estimate or 0))
        return kept

    def cheapest(self, candidates: list[Candidate]) -> list[Candidate]:
        """Of the per-layer candidates, :data:`BETWEEN_COMPILES`: the one the time model prices lowest
        (:func:`remat_opt.planner._saved_bytes.layer_cost`) of those not estimated over the budget,
        then the lowest priced of those estimated under :data:`SAFE` of it (the estimate errs: one
        pick should fit), then the next lowest priced; in ``candidates``' order, others as given."""
        plans = {id(c): c.layer_plan for c in candidates if c.layer_plan is not None}
        layered = [c for c in candidates if id(c) in plans]
        if len(layered) <= BETWEEN_COMPILES or self.layers is None:
            return candidates
        graph = time_graph_of(self.call, "layers", self.traced)
        stages = self.layers.layer_stages()
        cost = {key: layer_cost(graph, self.layers, [policy_saves(graph, plan.policies[s]) for s in stages])
                for key, plan in plans.items()}
        ranked = sorted(layered, key=lambda c: cost[id(c)])
        budget = self.call.budget
        slots = [lambda c: c.estimate is None or c.estimate <= budget,
                 lambda c: c.estimate is not None and c.estimate <= SAFE * budget] + [lambda c: True] * BETWEEN_COMPILES
        kept: list[int] = []
        for slot in slots:
            pick = next((c for c in ranked if id(c) not in kept and slot(c)), None)
            if pick is not None and len(kept) < BETWEEN_COMPILES:
                kept.append(id(pick))
        for c in layered:
            if id(c) not in kept:
                logger.info("candidate %s: not among the %d the time model prices lowest: not compiled",
                            c.label, BETWEEN_COMPILES)
        return [c for c in candidates if c.layer_plan is None or id(c) in kept]

    def estimate(self, measured: list[Candidate], per_layer: Sequence[StagePolicy | float]) -> float | None:
        """XLA's peak for the layers under ``per_layer``, before it is compiled: the least-memory
        uniform plan's measured peak, plus for each layer what its policy adds to it: a built-in
        policy, its uniform plan's measured peak over the least, shared among the layers; a
        number, the bytes it saves, as XLA counts them. ``None`` where a peak it needs was not
        measured, or where a layer runs as written: what that adds depends on where the step
        peaks (nothing, where it peaks in that layer's backward), which no measured peak says."""
        assert self.layers is not None
        uniform, count = self._uniform_of(measured), self.layers.count
        least = uniform.get(LADDER[0])
        if least is None or least.peak_bytes is None or None in per_layer:
            return None
        total = float(least.peak_bytes)
        for policy in per_layer:
            if isinstance(policy, float):
                total += policy
                continue
            top = uniform.get(policy)
            if top is None or top.peak_bytes is None:
                return None
            total += (top.peak_bytes - least.peak_bytes) / count
        return total

    def nested(self, measured: list[Candidate], fenced: bool) -> list[Candidate]:
        """Where every layer under :data:`LADDER`'s least-memory policy does not fit the budget: the
        same, nested in groups of two layers and of about the square root of their count, each
        group under one more checkpoint that saves nothing (:class:`remat_opt.rewrite._layers.LayerPlan`'s ``groups``)."""
        uniform = {c.layer_plan.fenced: c for c in measured if c.layer_plan is not None
                   and not c.layer_plan.groups and c.label.startswith(f"every layer {LADDER[0]}")}
        least = uniform.get(fenced, uniform.get(False))
        if self.layers is None or self.layers.count < 4 or least is None or \
                (least.peak_bytes is not None and least.peak_bytes <= self.call.budget):
            return []
        count, stages = self.layers.count, self.layers.layer_stages()
        out = []
        for size in sorted({2, max(2, round(count ** 0.5))}):
            groups = tuple((stages[i], stages[min(i + size, count) - 1] + 1) for i in range(0, count, size)
                           if min(i + size, count) - i >= 2)
            label = f"nested: every layer {LADDER[0]}, in {len(groups)} groups of up to {size}"
            out.append(self.layer_candidate([LADDER[0]] * count, label, fenced, groups=groups))
        return out

    def uniform(self, fenced: bool) -> list[Candidate]:
        """Every layer under one policy of :data:`LADDER`, for each."""
        if self.layers is None:
            return []
        count = self.layers.count
        return [self.layer_candidate([p] * count, f"every layer {p}", fenced) for p in LADDER]

    def loops(self) -> list[Candidate]:
        """Each policy of :data:`LADDER` on the body of the program's scans, and each name recipe
        a user of the names the body carries can write (MaxText's, :func:`recipe_candidates`)."""
        if not planned_scans(self.traced):
            return []
        plans = [LoopPlan(str(p)) for p in LADDER] + recipe_candidates(user_names(self.traced))
        return [Candidate(str(plan), with_signature(self.call.fn, self.traced, loop_program(self.traced, plan)),
                          loop_plan=plan) for plan in plans]

    def maybe_undone(self, measured: list[Candidate]) -> bool:
        """Whether the compiler may have undone the bare per-layer checkpoints: the least-memory
        one peaks above :data:`remat_opt.memory._barriers.UNDONE` of the plain program's peak."""
        plain, least = measured[0], next((c for c in measured if c.layer_plan is not None), None)
        if least is None:
            return False
        if least.peak_bytes is None or plain.peak_bytes is None:  # then it did not fit the device, or only it did
            return least.peak_bytes is None
        return least.peak_bytes > UNDONE * plain.peak_bytes

    def choose_family(self, measured: list[Candidate]) -> None:
        """Fenced or bare, whichever family's least-memory per-layer plan XLA measured lower."""
        least = {c.layer_plan.fenced: c.peak_bytes for c in measured
                 if c.layer_plan is not None and c.label.startswith(f"every layer {LADDER[0]}")}
        bare, fenced = least.get(False), least.get(True)
        self.fenced = fenced is not None and (bare is None or fenced < bare)

    def between(self, measured: list[Candidate]) -> list[Candidate]:
        """Plans between the fastest fitting per-layer policy and the next one up (see the module docstring)."""
        if self.layers is None:
            return []
        uniform = self._uniform_of(measured)
        fits = [p for p in LADDER if p in uniform and uniform[p].step_seconds is not None]
        if not fits:
            return []
        low = max(fits, key=LADDER.index)  # the fitting policy that saves the most
        count = self.layers.count
        out = [self._mix(low, None, 0, last_plain=True, measured=measured)]
        up = next((p for p in LADDER[LADDER.index(low) + 1:] if p in uniform), None)
        plain = next((c for c in measured if c.label == "plain"), None)
        top = uniform[up] if up is not None else plain
        low_peak, top_peak = uniform[low].peak_bytes, top.peak_bytes if top is not None else None
        if top_peak is None or low_peak is None or top_peak <= low_peak:
            return out
        # XLA's peaks of the two uniform plans, read as a cost per layer moved up the ladder.
        k = min(count - 1, int((self.call.budget - low_peak) * count // (top_peak - low_peak)))
        if k >= 1:
            out.append(self._mix(low, up, k, last_plain=False, measured=measured))
        out += [self._mix(low, up, j, last_plain=True, measured=measured) for j in (k - 1, k - 2)
                if 1 <= j <= count - 2]
        return out

    def saves_by_time(self, measured: list[Candidate]) -> list[Candidate]:
        """Every layer saving the values the time model chooses (:func:`layer_saves` over
        :func:`remat_opt.planner._saved_bytes.time_graph`) in the bytes the budget leaves above the
        least-memory per-layer plan; in each share of them in
        :data:`remat_opt.planner._saved_bytes.CAP_SHARES`, and in all with the last layer as written."""
        if self.layers is None:
            return []
        uniform = self._uniform_of(measured)
        least = uniform.get(LADDER[0])
        if least is None or least.peak_bytes is None:
            return []
        graph = time_graph_of(self.call, "layers", self.traced)
        peaks = {str(p): c.peak_bytes for p, c in uniform.items()}
        scale = xla_bytes_per_model_byte(dot_bytes(graph, self.layers.spans()), peaks, least.peak_bytes)
        allowance = (self.call.budget - least.peak_bytes) / scale
        caps = saving_caps(allowance)
        out: list[Candidate] = []
        seen: set[frozenset[int]] = set()
        chosen = layer_saves(graph, self.layers, caps, store=store_costs(graph)) if caps else []
        for cap, saved in zip(caps, chosen):
            if not saved or saved in seen:
                continue
            seen.add(saved)
            names: list[StagePolicy] = list(layer_names(graph, self.layers, saved))
            added = [scale * b for b in layer_bytes(graph, self.layers, saved)]
            label = f"every layer saving {len(saved)} values chosen by time in {format_bytes(cap)}"
            out.append(self.layer_candidate(names, label, self.fenced, self.estimate(measured, added)))
            if len(out) == 1:
                out.append(self.layer_candidate(names[:-1] + [None], label + ", the last as written", self.fenced))
        return out

    def body_saves_by_time(self, measured: list[Candidate]) -> list[Candidate]:
        """For a program whose layers are one ``lax.scan``: its body saving the values the time model
        chooses (:func:`remat_opt.solve._body.choose_saved` over
        :func:`remat_opt.planner._saved_bytes.time_graph` of the body), in the bytes per iteration
        the budget leaves above the body under ``nothing_saveable``, in each share of them in
        :data:`remat_opt.planner._saved_bytes.CAP_SHARES`."""
        positions = planned_scans(self.traced)
        peaks = {c.loop_plan.policy: c.peak_bytes for c in measured
                 if c.loop_plan is not None and c.loop_plan.policy is not None}
        least = peaks.get(str(LADDER[0]))
        if len(positions) != 1 or least is None:
            return []
        body = scan_body(self.traced, positions[0])
        graph = time_graph_of(self.call, "body", body.program)
        model = {p: body.length * b for p, b in dot_bytes(graph).items()}
        allowance = (self.call.budget - least) / (xla_bytes_per_model_byte(model, peaks, least) * body.length)
        out: list[Candidate] = []
        seen: set[tuple[str, ...]] = set()
        for cap in saving_caps(allowance):
            saved = choose_saved(graph, cap, BODY_SOLVER, store_costs(graph)).saved
            if saved and saved not in seen:
                seen.add(saved)
                plan = LoopPlan(None, saved=saved)
                out.append(Candidate(f"{plan}, chosen by time in {format_bytes(cap)} an iteration",
                                     with_signature(self.call.fn, self.traced, loop_program(self.traced, plan)),
                                     loop_plan=plan))
        return out

    def _uniform_of(self, measured: list[Candidate]) -> dict[StagePolicy, Candidate]:
        """The measured plans with every layer under one policy, by policy."""
        assert self.layers is not None
        stages = self.layers.layer_stages()
        out = {}
        for c in measured:
            if c.layer_plan is not None and c.layer_plan.fenced == self.fenced and not c.layer_plan.groups and \
                    len({c.layer_plan.policies[s] for s in stages}) == 1:
                out[c.layer_plan.policies[stages[0]]] = c
        return out

    def _mix(self, low: StagePolicy, up: StagePolicy, k: int, last_plain: bool,
             measured: list[Candidate]) -> Candidate:
        """``k`` layers under ``up`` after the others under ``low``, then, if ``last_plain``, the last
        layer as written."""
        assert self.layers is not None
        rest = self.layers.count - k - int(last_plain)
        per_layer = [low] * rest + [up] * k + [None] * int(last_plain)
        parts = [f"{rest} x {low}"] + ([f"{k} x {up or 'as written'}"] if k else [])
        parts += ["the last as written"] if last_plain else []
        return self.layer_candidate(per_layer, "layers: " + ", then ".join(parts), self.fenced,
                                    self.estimate(measured, per_layer))

    def measure(self, candidates: list[Candidate]) -> list[Candidate]:
        """Each candidate compiled for its peak (in parallel); those that fit the budget, run for their time.

        A candidate this process already measured for the same function and arguments (a sweep
        of budgets) is not compiled or run again (:func:`remat_opt.planner._candidates.measured_of`)."""
        call, known = self.call, measured_of(self.call)
        fresh = [c for c in candidates if c.label not in known]
        progress.stage(f"step-time search: compiling {len(fresh)} candidate(s) in parallel")
        compiled = compile_steps([c.program for c in fresh], call.args, call.kwargs, call.nums, call.has_aux)
        known.update({c.label: (result, None, c) for c, result in zip(fresh, compiled)})
        # Candidates that compiled to one executable (compile_steps) are run once.
        timed: dict[int, float | None] = {id(r): s for r, s, _ in known.values() if s is not None}
        out = []
        for candidate in candidates:
            result, seconds, _ = known[candidate.label]
            if seconds is None and result.peak_bytes is not None and result.peak_bytes <= call.budget:
                if id(result) not in timed:
                    progress.stage(f"step-time search: running {candidate.label}")
                    timed[id(result)] = step_seconds(result, self.inputs(result), call.repeats)
                seconds = timed[id(result)]
                known[candidate.label] = (result, seconds, candidate)
            fits = result.peak_bytes is not None and result.peak_bytes <= call.budget
            logger.info("candidate %s: peak %s%s, compiled in %.1f s, step %s", candidate.label,
                        "does not fit the device" if result.peak_bytes is None else format_bytes(result.peak_bytes),
                        "" if candidate.estimate is None else f" (estimated {format_bytes(candidate.estimate)})",
                        result.seconds, f"{1e3 * seconds:.2f} ms" if fits and seconds else "not run")
            out.append(dataclasses.replace(candidate, compiled=result, step_seconds=seconds if fits else None))
        return out

    def recalled(self, tried: list[Candidate]) -> list[Candidate]:
        """The candidates this process measured for the same function and arguments at other budgets
        that fit this one: a larger budget is never answered by a slower plan than a smaller one."""
        labels = {c.label for c in tried}
        return [c for label, (result, _, c) in measured_of(self.call).items() if label not in labels
                and result.peak_bytes is not None and result.peak_bytes <= self.call.budget]

    def inputs(self, compiled: Compiled) -> tuple:
        """What every candidate's step is timed on (:func:`remat_opt.memory._timing.run_inputs`; once
        per call: every candidate's step takes the same)."""
        if self._inputs is None:
            call = self.call
            self._inputs = run_inputs(call.fn, call.args, call.kwargs, call.nums, call.has_aux, compiled.step_args)
        return self._inputs


def _nothing_fits(budget: int, tried: list[Candidate]) -> InfeasibleBudgetError:
    measured = [c for c in tried if c.peak_bytes is not None]
    if not measured:  # no budget this device holds is met: name one byte past its memory
        try:
            memory = device_memory()
        except InvalidBudgetError:  # a device that reports no memory: past the budget asked
            memory = None
        beyond = (memory if memory is not None else budget) + 1
        where = "the device" + (f" ({format_bytes(memory)})" if memory is not None else "")
        return InfeasibleBudgetError(budget, beyond, detail=(
            f"(XLA could not fit any of the step-time search's {len(tried)} candidates into {where}: "
            "try a smaller batch, or a device with more memory.)"))
    lowest = min(measured, key=lambda c: c.peak_bytes or 0)
    peak = int(lowest.peak_bytes or 0)
    return InfeasibleBudgetError(budget, peak, detail=f"(the lowest peak XLA measured among the step-time "
                                 f"search's {len(tried)} candidates: {lowest.label}, {peak:,} bytes.)")


def _plan(call: TimedCall, traced: TracedProgram, best: Candidate, plain: Candidate, tried: list[Candidate],
          seconds: float) -> Plan:
    """The plan of the fastest candidate, with every candidate's figures."""
    graph = model_graph(traced, call.cost_model)
    sim = simulate(graph, Schedule(plain=True))
    baseline = gradient_flops(call.fn, call.args, call.kwargs, call.nums, call.cost_model, call.has_aux)
    flops = baseline if best.program is call.fn else gradient_flops(
        best.program, call.args, call.kwargs, call.nums, call.cost_model, call.has_aux)
    order = sorted(tried, key=lambda c: (c.step_seconds is None, c.step_seconds or 0.0))
    return Plan(
        graph=annotate(graph, sim), budget_bytes=call.budget, predicted_peak_bytes=best.estimate,
        measured_peak_bytes=best.peak_bytes, plain_peak_bytes=plain.peak_bytes,
        recompute_flops=flops - baseline, measured_recompute_flops=flops - baseline, baseline_flops=baseline,
        status="TIMED", gap=1.0, solve_seconds=seconds, attempts=len(tried), schedule=Schedule(plain=True),
        jax_version=jax.__version__, loop_plan=best.loop_plan, layer_plan=best.layer_plan,
        step_seconds=best.step_seconds, plain_step_seconds=plain.step_seconds,
        timed=tuple(c.figure() for c in order),
    )
