"""A plan of the persistent cache rebuilt from its decisions, and checked against its own figures.

:mod:`remat_opt._cache` stores what a plan decided (a schedule, a loop plan, a
whole-function policy) beside the figures measured when it was made; this
module rebuilds, for the function at hand, the program and the graph
:class:`remat_opt.OptimizedFunction` made them for (a trace and a graph, no
solve, no compile). A schedule's rebuilt program must recompute the FLOPs the
entry says, and compute as many stored values once, or the entry is not trusted.
:func:`cached_plan` is the planner's way in: an entry's plan, else a new one, then kept; a
budget refused (:class:`remat_opt.InfeasibleBudgetError`) is kept too, and refused again at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._cache import (
    CacheEntryError,
    cache_directory,
    derivative_text,
    entry_loop_plan,
    entry_path,
    entry_refusal,
    entry_schedule,
    layout_of,
    names_cost_model,
    options_of,
    plan_entry,
    plan_from_entry,
    plan_key,
    plan_kind,
    qualified_name,
    read_entry,
    refusal_entry,
    report,
    write_entry,
)
from . import _progress as progress
from ._errors import InfeasibleBudgetError
from ._plan import Plan, annotate, measured_flops_of
from .memory._facts import model_graph, unknown_of
from .memory._measure import gradient_flops
from .memory._once import once_values
from .memory._sharded import is_sharded
from .memory._simulate import simulate
from .program._manual import planned_body
from .program._trace import TracedProgram, grad_argnums, normalize_argnums, trace, with_signature
from .rewrite._apply import apply_schedule
from .rewrite._loops import loop_program
from .rewrite._policies import policy_program


def restored(optimized: Any, entry: dict, whole: TracedProgram, args: tuple, kwargs: dict,
             argnums: tuple[int, ...]) -> tuple[Plan, Callable[..., Any]]:
    """The plan and program of a cache entry for ``optimized`` (an
    :class:`remat_opt.OptimizedFunction`), rebuilt as its planner built them.

    Raises:
        CacheEntryError: the entry holds a schedule outside the program traced
            now, or its rebuilt program counts other figures than it stores.
    """
    fn, cost_model = optimized.fn, optimized.cost_model
    kind, schedule = entry["kind"], entry_schedule(entry)
    if kind == "loop":
        loop_plan = entry_loop_plan(entry)
        if loop_plan is None:
            raise CacheEntryError("is a loop plan's entry without a loop plan")
        program = with_signature(fn, whole, loop_program(whole, loop_plan))
        graph = model_graph(trace(program, args, kwargs, argnums), cost_model)
    elif kind == "plain":
        program, graph = fn, model_graph(whole, cost_model)
    elif kind == "policy":
        program, graph = policy_program(fn, entry["plan"]["whole_policy"]), model_graph(whole, cost_model)
    else:
        scans = optimized.unroll_scans and any(e.primitive.name == "scan" for e in whole.jaxpr.jaxpr.eqns)
        traced = trace(fn, args, kwargs, argnums, optimized.unroll_scans) if scans else whole
        graph = model_graph(planned_body(traced) or traced, cost_model)  # a shard_map body's, as planned
        if (any(not 0 <= c <= graph.num_positions for c in schedule.all_cuts())
                or any(not 0 <= v < graph.num_nodes for v in schedule.saved)):
            raise CacheEntryError("holds a schedule outside the program traced now")
        program = apply_schedule(fn, graph, schedule, compute_saved_once=optimized.compute_saved_once)
    sim = simulate(graph, schedule)
    plan = plan_from_entry(entry, annotate(graph, sim))
    if kind != "schedule":
        return plan, program
    once = len(once_values(graph, schedule)) if optimized.compute_saved_once else 0
    stored, rebuilt = plan.recompute_flops, sim.recompute_flops
    if is_sharded(args, kwargs):  # its model priced collectives off XLA's partitioned compile: check the jaxpr
        nums = grad_argnums(argnums)
        stored = measured_flops_of(plan)
        rebuilt = gradient_flops(program, args, kwargs, nums, cost_model, optimized.has_aux) - plan.baseline_flops
    if (rebuilt, once) != (stored, plan.computed_once):
        raise CacheEntryError(f"counts {stored:,} FLOPs recomputed and {plan.computed_once} values computed "
                              f"once; the program rebuilt from it {rebuilt:,} and {once}")
    return plan, program


def cached_plan(optimized: Any, args: tuple, kwargs: dict) -> tuple[Plan, Callable[..., Any]]:
    """The plan of :func:`cached_or_new_plan`, its progress shown while it takes time (:mod:`remat_opt._progress`)."""
    with progress.planning(getattr(optimized.fn, "__name__", "fn"), optimized.budget_bytes):
        return cached_or_new_plan(optimized, args, kwargs)


def cached_or_new_plan(optimized: Any, args: tuple, kwargs: dict) -> tuple[Plan, Callable[..., Any]]:
    """The plan of a trusted entry of ``optimized``'s persistent cache, else
    the one its planner makes (``optimized._make_plan``), then kept there.

    Loading traces the function and builds its graph, and rewrites it from the
    stored decisions: no solver call, no compile. The plan keeps the figures
    measured when it was made. On a mesh the key holds each argument's
    sharding, and the restored plan's graph gives each value's bytes for the
    whole array (one device's come from XLA's partitioned compile, which
    loading skips); its figures are one device's, as measured. A cost model
    that is not a dataclass is named in the key by its type alone, so its plans
    are neither read nor kept (a :class:`CacheWarning` says so once).
    """
    directory = cache_directory(optimized.cache)
    if directory is None:
        return optimized._make_plan(args, kwargs)
    if not names_cost_model(optimized.cost_model):
        # The key names such a cost model by its type alone: two of one type would share plans.
        model_type = type(optimized.cost_model)
        report(directory, f"keeps no plan of a cost model that is not a dataclass ({model_type.__module__}."
               f"{model_type.__qualname__}): the key cannot tell two of them apart. Make it a dataclass whose "
               "fields set its costs to have its plans kept.")
        return optimized._make_plan(args, kwargs)
    argnums = normalize_argnums(optimized.argnums, len(args))
    whole = trace(optimized.fn, args, kwargs, argnums)
    key = plan_key(whole, optimized.budget_bytes, options_of(optimized, argnums),
                   layout_of(args, kwargs, optimized.interconnect),
                   derivative_text(whole, optimized.fn, args, kwargs, grad_argnums(argnums), optimized.has_aux))
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
            return restored(optimized, entry, whole, args, kwargs, argnums)
        except (LookupError, TypeError, ValueError) as err:  # an entry that does not rebuild is not trusted
            report(entry_path(directory, key), f"does not rebuild ({type(err).__name__}: {err}); planning again.")
    try:
        plan, program = optimized._make_plan(args, kwargs)
    except InfeasibleBudgetError as err:  # kept like a plan: the same question is answered at once
        write_entry(directory, key, refusal_entry(err, qualified_name(optimized.fn)))
        raise
    kind = plan_kind(plan)
    # Not kept: a schedule whose model took XLA's account of primitives no rule
    # knows (a compile the entry does not carry; a graph rebuilt without it
    # could rewrite another program than the one measured). A loop plan's or a
    # whole-function policy's program does not depend on the graph.
    unknown = unknown_of(p for _, p in plan.graph.nodes(data="primitive") if p != "input")
    if kind is not None and not (kind not in ("loop", "policy") and optimized.xla_facts and unknown):
        write_entry(directory, key, plan_entry(plan, kind, qualified_name(optimized.fn)))
    return plan, program
