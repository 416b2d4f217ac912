"""A plan of the persistent cache rebuilt from its decisions, and checked against its own figures.

:mod:`remat_opt.cache._cache` stores what a plan decided (a schedule, a loop plan, a
whole-function policy) beside the figures measured when it was made; this
module rebuilds, for the function at hand, the program and the graph
:class:`remat_opt.OptimizedFunction` made them for (a trace and a graph, no
solve, no compile). A schedule's rebuilt program must recompute the FLOPs the
entry says, and compute as many stored values once, or the entry is not trusted.
:func:`cached_or_new_plan` is the planner's way in, with the call (:class:`remat_opt.cache._call.Call`)
and its search: an entry's plan, else the search's, then kept; a budget refused
(:class:`remat_opt.InfeasibleBudgetError`) is kept too, and refused again at once. The planner
shows its progress around it (:mod:`remat_opt.planner._progress`): the cache only loads and keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._cache import (
    CacheEntryError,
    cache_directory,
    entry_layer_plan,
    entry_loop_plan,
    entry_path,
    entry_refusal,
    entry_schedule,
    names_cost_model,
    plan_entry,
    plan_from_entry,
    plan_kind,
    qualified_name,
    read_entry,
    refusal_entry,
    report,
    write_entry,
)
from ._call import Call
from .._errors import InfeasibleBudgetError
from .._plan import Plan, Planned, annotate, measured_flops_of
from .._schedule import Schedule, Simulation
from ..memory._facts import unknown_of
from ..memory._measure import gradient_flops
from ..memory._once import once_values
from ..memory._pipeline import program_model
from ..memory._sharded import is_sharded
from ..memory._simulate import simulate
from ..program._graph import ProgramGraph
from ..program._trace import with_signature
from ..rewrite._apply import apply_schedule
from ..rewrite._layers import layer_program
from ..rewrite._loops import loop_program
from ..rewrite._policies import policy_program


def restored(call: Call, entry: dict) -> Planned:
    """The plan and program of a cache entry for ``call``, rebuilt as the planner built them.

    Raises:
        CacheEntryError: the entry holds a schedule outside the program traced
            now, or its rebuilt program counts other figures than it stores.
    """
    fn, whole = call.fn, call.whole
    # Loop plans, layer plans, policies and the plain program are modelled on fn as written (memory._pipeline).
    written = call.options.model_options.as_written()
    kind, schedule = entry["kind"], entry_schedule(entry)
    if kind == "loop":
        loop_plan = entry_loop_plan(entry)
        if loop_plan is None:
            raise CacheEntryError("is a loop plan's entry without a loop plan")
        program = with_signature(fn, whole, loop_program(whole, loop_plan))
        graph = program_model(dataclasses.replace(call.step, fn=program), written).graph
    elif kind == "layers":
        layer_plan = entry_layer_plan(entry)
        if layer_plan is None or layer_plan.bounds[-1] != len(whole.jaxpr.jaxpr.eqns):
            raise CacheEntryError("holds no layer plan for the program traced now")
        program = with_signature(fn, whole, layer_program(whole, layer_plan))
        graph = program_model(call.step, written, whole).graph
    elif kind == "plain":
        program, graph = fn, program_model(call.step, written, whole).graph
    elif kind == "policy":
        program = policy_program(fn, entry["plan"]["whole_policy"])
        graph = program_model(call.step, written, whole).graph
    else:
        program, graph = _scheduled(call, schedule)
    sim = simulate(graph, schedule)
    plan = plan_from_entry(entry, annotate(graph, sim))
    if kind == "schedule":
        _check_counts(call, plan, program, graph, sim)
    return plan, program


def _scheduled(call: Call, schedule: Schedule) -> tuple[Callable[..., Any], ProgramGraph]:
    """``fn`` rewritten under ``schedule``, on the graph the planner made it for (scans unrolled
    as ``unroll_scans`` says, a shard_map's body), which must hold it."""
    options, whole = call.options, call.whole
    scans = options.unroll_scans and any(e.primitive.name == "scan" for e in whole.jaxpr.jaxpr.eqns)
    # The planner's model of the program (memory._pipeline), but for what only a compile reads:
    # scans traced again and unrolled if it has any, a shard_map's body.
    graph = program_model(call.step, options.model_options.rebuilt(), None if scans else whole).graph
    if (any(not 0 <= c <= graph.num_positions for c in schedule.all_cuts())
            or any(not 0 <= v < graph.num_nodes for v in schedule.saved)):
        raise CacheEntryError("holds a schedule outside the program traced now")
    return apply_schedule(call.fn, graph, schedule, compute_saved_once=options.compute_saved_once), graph


def _check_counts(call: Call, plan: Plan, program: Callable[..., Any], graph: ProgramGraph,
                  sim: Simulation) -> None:
    """Raises :class:`CacheEntryError` unless the program rebuilt from a schedule's entry
    (``program``; ``sim``, its simulation on ``graph``) recomputes the FLOPs the entry
    stores, and computes as many values once."""
    if plan.schedule is None:
        raise CacheEntryError("is a schedule's entry without a schedule")
    once = len(once_values(graph, plan.schedule)) if call.options.compute_saved_once else 0
    stored, flops = plan.recompute_flops, sim.recompute_flops
    if is_sharded(call.args, call.kwargs):  # its model priced collectives off XLA's partitioned compile: the jaxpr
        stored = measured_flops_of(plan)
        flops = gradient_flops(program, call.args, call.kwargs, call.nums, call.options.cost_model,
                               call.has_aux) - plan.baseline_flops
    if (flops, once) != (stored, plan.computed_once):
        raise CacheEntryError(f"counts {stored:,} FLOPs recomputed and {plan.computed_once} values computed "
                              f"once; the program rebuilt from it {flops:,} and {once}")


def cached_or_new_plan(call: Call, new_plan: Callable[[Call], Planned]) -> Planned:
    """The plan of a trusted entry of the persistent cache for ``call``, else
    the one ``new_plan`` makes (the planner's search), then kept there.

    Loading traces the function and builds its graph, and rewrites it from the
    stored decisions: no solver call, no compile. The plan keeps the figures
    measured when it was made. On a mesh the key holds each argument's
    sharding, and the restored plan's graph gives each value's bytes for the
    whole array (one device's come from XLA's partitioned compile, which
    loading skips); its figures are one device's, as measured. A cost model
    that is not a dataclass is named in the key by its type alone, so its plans
    are neither read nor kept (a :class:`CacheWarning` says so once).
    """
    options = call.options
    directory = cache_directory(options.cache)
    if directory is None:
        return new_plan(call)
    if not names_cost_model(options.cost_model):
        # The key names such a cost model by its type alone: two of one type would share plans.
        model_type = type(options.cost_model)
        report(directory, f"keeps no plan of a cost model that is not a dataclass ({model_type.__module__}."
               f"{model_type.__qualname__}): the key cannot tell two of them apart. Make it a dataclass whose "
               "fields set its costs to have its plans kept.")
        return new_plan(call)
    key = call.key(call.budget)
    entry = read_entry(directory, key)
    if entry is not None and entry["kind"] == "refused":
        try:
            refusal = entry_refusal(entry, entry_path(directory, key))
        except CacheEntryError as err:
            report(entry_path(directory, key), f"{err}; planning again.")
        else:
            raise refusal
    elif entry is not None:
        try:
            return restored(call, entry)
        except (LookupError, TypeError, ValueError) as err:  # an entry that does not rebuild is not trusted
            report(entry_path(directory, key), f"does not rebuild ({type(err).__name__}: {err}); planning again.")
    try:
        plan, program = new_plan(call)
    except InfeasibleBudgetError as err:  # kept like a plan: the same question is answered at once
        write_entry(directory, key, refusal_entry(err, qualified_name(call.fn)))
        raise
    kind = plan_kind(plan)
    # Not kept: a schedule whose model took XLA's account of primitives no rule
    # knows (a compile the entry does not carry; a graph rebuilt without it
    # could rewrite another program than the one measured). A loop plan's or a
    # whole-function policy's program does not depend on the graph.
    unknown = unknown_of(p for _, p in plan.graph.nodes(data="primitive") if p != "input")
    if kind is not None and not (kind not in ("loop", "policy") and options.xla_facts and unknown):
        write_entry(directory, key, plan_entry(plan, kind, qualified_name(call.fn)))
    return plan, program
