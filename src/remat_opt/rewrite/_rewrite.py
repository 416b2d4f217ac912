"""Stage 5 — rewrite: the plan as a JAX program that XLA cannot undo.

Each segment of the plan but the last becomes ``jax.checkpoint`` with a
name-based policy (``save_only_these_names`` — the kind ``jax_remat3``
honours), wrapped in a ``jax.custom_vjp`` whose backward runs the segment's
recompute-and-transpose inside a ``lax.cond`` on a predicate read from the
incoming cotangent and the segment's output. The last segment runs as written
(its backward follows its forward at once; see :mod:`remat_opt.memory._simulate`).
A nested segment's function is its own level of such segments, so its
backward reruns it under the inner schedule: checkpoints within a checkpoint.

Why the fence: on XLA:CPU a bare ``jax.checkpoint`` is undone — CSE merges the
recomputation into the forward and the scheduler hoists it (docs/xla_findings.md §1, jax
#19822). A computation inside a conditional whose predicate XLA cannot fold
cannot start before that predicate exists, so the recomputation stays in the
backward pass where the plan put it (docs/xla_findings.md §2). Both branches compute the
same, exact gradient, so correctness never depends on the predicate's value.
A schedule marked ``bare`` (for a compiler that honours a bare checkpoint; the planner marks
one only once XLA measured it in the budget: :mod:`remat_opt.planner._unfenced`) has bare
``jax.checkpoint`` segments instead, with no conditional.

By default (``compute_saved_once``), in a plan that saves names, the stored
values XLA would rebuild in every reader from the operands they were computed
from (a residual stream) go through :func:`remat_opt.memory._once.computed_once`, so
XLA computes them once and frees those operands where the plan says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jax.extend import core

from ..program._graph import ProgramGraph
from ..program._names import eval_named, is_nameable, value_name
from ..memory._once import computed_once, first_element, once_values
from .._schedule import Schedule
from ..program._eval import read_atom
from ..program._trace import has_tangent


@dataclass(frozen=True)
class Segment:
    """Primal equations ``start:stop`` run as one fenced checkpoint."""

    start: int
    stop: int
    inputs: tuple[core.Var, ...]
    outputs: tuple[core.Var, ...]
    saved_names: tuple[str, ...]


def _first_elements(tree: Any) -> list[jax.Array]:
    """The first element of every non-empty floating leaf of ``tree``."""
    return [first_element(leaf) for leaf in jax.tree_util.tree_leaves(tree)
            if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.size]


def _is_primal(x: Any) -> bool:
    return isinstance(x, CustomVJPPrimal)


def _perturbed(arg: Any) -> bool:
    """Whether the caller differentiates some leaf of a ``custom_vjp`` argument (``symbolic_zeros``)."""
    return any(p.perturbed for p in jax.tree_util.tree_leaves(arg, is_leaf=_is_primal))


def _instantiated(cotangents: Any) -> Any:
    """``cotangents`` with JAX's symbolic zeros (outputs nothing reads) as arrays of zeros, as
    ``jax.custom_vjp`` passes them without ``symbolic_zeros``."""
    def array(c: Any) -> Any:
        if not isinstance(c, SymbolicZero):
            return c
        return np.zeros(c.shape, c.dtype) if c.dtype == jax.dtypes.float0 else jnp.zeros(c.shape, c.dtype)

    return jax.tree_util.tree_map(array, cotangents, is_leaf=lambda c: isinstance(c, SymbolicZero))


def _fence_predicate(probes: Sequence[jax.Array | None]) -> jax.Array | None:
    """``x == x`` over the probes: true unless one is NaN, and never a constant to XLA."""
    pred = None
    for x in probes:
        if x is not None:
            pred = (x == x) if pred is None else (pred & (x == x))
    return pred


def fenced_checkpoint(
    fn: Callable[..., Any],
    saved_names: Sequence[str],
    differentiable: Sequence[bool] | None = None,
    probe_output: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Callable[..., Any]:
    """``jax.checkpoint(fn)`` whose backward runs only once its cotangent exists.

    The predicate reads the incoming cotangents (so the backward cannot start
    before they exist), and with ``probe_output`` the segment's own output
    too: the cotangent of an output that nothing reads later (the loss's is
    the constant 1.0) is one XLA can fold, and a folded predicate would let it
    inline the branch and merge the recomputation back into the forward (CSE).
    Probing the output has a cost where the output is cheap elementwise work
    (``x @ w + b``): XLA recomputes the probed element from the operands in
    the backward and keeps them live until then (one activation more per
    segment: docs/measurements.md, "The demo"), so it is probed only where
    the cotangents alone might fold.

    Args:
        fn: function of arrays to checkpoint.
        saved_names: ``checkpoint_name`` names the forward keeps; everything
            else the backward needs is recomputed.
        differentiable: per argument, whether it carries a tangent in the
            user's program (``TracedProgram.tangent_vars``); the others are
            closed over, so the backward never transposes what JAX would not
            (a ``while`` loop on a ``stop_gradient`` value, say). All by default.
        probe_output: whether the predicate also reads the segment's output;
            needed when no later computation reads any of its outputs.
        policy: a ``jax.checkpoint`` policy to use instead of ``saved_names``
            (a built-in one, for the fenced per-layer baselines).

    Returns:
        A function with ``fn``'s signature and values.
    """
    policy = policy or jax.checkpoint_policies.save_only_these_names(*saved_names)
    remat = jax.checkpoint(fn, policy=policy, prevent_cse=False)

    @jax.custom_vjp
    def call(*args: Any) -> Any:
        return fn(*args)

    def fwd(*primals: Any) -> tuple[Any, Any]:
        args = tuple(jax.tree_util.tree_map(lambda p: p.value, a, is_leaf=_is_primal) for a in primals)
        # The arguments to transpose: the planned ones, and any other a caller differentiates
        # (jax.grad(step, argnums=1) on a plan made for argnums=0), or its cotangent would be zero.
        mask = (True,) * len(args) if differentiable is None else tuple(
            d or _perturbed(a) for d, a in zip(differentiable, primals))

        def of_differentiable(*diff: Any) -> Any:
            it = iter(diff)
            return remat(*(next(it) if d else a for a, d in zip(args, mask)))

        out, vjp_fn = jax.vjp(of_differentiable, *(a for a, d in zip(args, mask) if d))
        # The mask rides in the residuals' tree structure (() or None per argument): static, leafless.
        return out, (vjp_fn, _first_elements(out)[:1] if probe_output else [], tuple(() if d else None for d in mask))

    def bwd(res: Any, cotangents: Any) -> Any:
        vjp_fn, out_probe, marks = res

        def transpose(cts: Any) -> Any:
            # A function, not vjp_fn itself: lax.cond names its branches by str(branch)
            # when it has no code object, and vjp_fn's str prints its whole jaxpr, three
            # times per fence (a quarter of tracing a rewritten program).
            return vjp_fn(cts)

        cotangents = _instantiated(cotangents)
        pred = _fence_predicate([*_first_elements(cotangents), *out_probe])
        cts = vjp_fn(cotangents) if pred is None else lax.cond(pred, transpose, transpose, cotangents)
        it = iter(cts)
        return tuple(next(it) if m is not None else None for m in marks)

    call.defvjp(fwd, bwd, symbolic_zeros=True)
    return call


def segments_of(graph: ProgramGraph, schedule: Schedule, start: int = 0, stop: int | None = None) -> tuple[Segment, ...]:
    """Splits primal equations ``start:stop`` (the whole program by default) at the schedule's cuts."""
    jaxpr = graph.traced.jaxpr.jaxpr
    n = len(jaxpr.eqns)
    stop = n if stop is None else stop
    bounds = [start, *sorted(c for c in schedule.cuts if start < c < stop), stop]
    names_at: dict[int, list[str]] = {}
    for node in schedule.saved:
        unit = graph.units[graph.node_unit[node]]
        if unit.name is not None:  # saved nodes are name units
            names_at.setdefault(unit.position, []).append(unit.name)
    later_reads: list[set] = [set() for _ in range(n + 1)]  # vars read at or after position p
    acc = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    later_reads[n] = set(acc)
    for p in range(n - 1, -1, -1):
        acc |= {v for v in jaxpr.eqns[p].invars if isinstance(v, core.Var)}
        later_reads[p] = set(acc)
    segments = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        defined = {v for e in jaxpr.eqns[lo:hi] for v in e.outvars}
        read = []
        for e in jaxpr.eqns[lo:hi]:
            read += [v for v in e.invars if isinstance(v, core.Var) and v not in defined and v not in read]
        outs = [v for e in jaxpr.eqns[lo:hi] for v in e.outvars if v in later_reads[hi]]
        names = {name for p in range(lo, hi) for name in names_at.get(p, ())}
        # The segment's outputs are kept anyway (they cross the boundary). Saved by
        # name, jax.checkpoint does not recompute them for the residuals it needs.
        for p in range(lo, hi):
            for k, v in enumerate(jaxpr.eqns[p].outvars):
                if v in later_reads[hi] and is_nameable(v.aval):
                    names.add(value_name(p, k))
        segments.append(Segment(lo, hi, tuple(read), tuple(outs), tuple(sorted(names))))
    return tuple(segments)


def rewrite(
    graph: ProgramGraph, schedule: Schedule, *, compute_saved_once: bool = True
) -> Callable[..., list[Any]]:
    """The program of ``graph`` under ``schedule``, as a function of flat inputs.

    With ``compute_saved_once``, the values :func:`remat_opt.memory._once.once_values`
    lists go through :func:`remat_opt.memory._once.computed_once`.
    """
    closed = graph.traced.jaxpr
    jaxpr = closed.jaxpr
    once = once_values(graph, schedule) if compute_saved_once else frozenset()

    def wrap(i: int, k: int, value: Any) -> Any:
        return computed_once(value) if (i, k) in once else value

    run = _level(graph, schedule, 0, len(jaxpr.eqns), wrap if once else None, schedule.bare)

    def program(*flat_args: Any) -> list[Any]:
        env: dict = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, flat_args))
        run(env)
        return [read_atom(env, v) for v in jaxpr.outvars]

    return program


def _level(
    graph: ProgramGraph, schedule: Schedule, start: int, stop: int,
    wrap: Callable[[int, int, Any], Any] | None = None, bare: bool = False,
) -> Callable[[dict], None]:
    """Equations ``start:stop`` under one level of ``schedule``, evaluated into an environment.

    Every segment but the last is a fenced checkpoint (a bare one with ``bare``); a nested segment's
    function is its own level, so its backward reruns it under the inner
    schedule (checkpoints within a checkpoint). The last segment runs as
    written: its backward follows its forward at once, so recomputing it
    would only cost FLOPs (see :mod:`remat_opt.memory._simulate`). ``wrap`` is
    passed to :func:`remat_opt.program._names.eval_named` (flat levels only).
    """
    jaxpr = graph.traced.jaxpr.jaxpr
    segments = segments_of(graph, schedule, start, stop)
    nested = dict(schedule.nested)
    tangent = graph.traced.tangent_vars

    def segment_fn(seg: Segment) -> Callable[..., tuple[Any, ...]]:
        inner = _level(graph, nested[seg.start], seg.start, seg.stop, bare=bare) if seg.start in nested else None

        def run(*vals: Any) -> tuple[Any, ...]:
            env = dict(zip(seg.inputs, vals))
            if inner is None:
                eval_named(jaxpr, env, seg.start, seg.stop, wrap=wrap)
            else:
                inner(env)
            return tuple(env[v] for v in seg.outputs)

        return run

    def checkpointed(seg: Segment, later: set) -> Callable[..., Any]:
        """A segment but the last: a fenced checkpoint, or a bare one with ``bare``; as written
        where nothing in it is differentiated (it has no backward to fence)."""
        fn, differentiable = segment_fn(seg), tuple(v in tangent for v in seg.inputs)
        if not any(differentiable):
            return fn
        if bare:
            return jax.checkpoint(fn, policy=jax.checkpoint_policies.save_only_these_names(*seg.saved_names))
        return fenced_checkpoint(fn, seg.saved_names, differentiable,
                                 probe_output=not any(v in later for v in seg.outputs))

    read_later = [{v for e in jaxpr.eqns[s.stop:] for v in e.invars if isinstance(v, core.Var)} for s in segments]
    fns = [checkpointed(s, later) for s, later in zip(segments[:-1], read_later)]
    fns.append(segment_fn(segments[-1]))

    def run_level(env: dict) -> None:
        for seg, fn in zip(segments, fns):
            outs = fn(*(env[v] for v in seg.inputs))
            # An integer output of a fenced segment carries a (float0) tangent out of
            # its custom_vjp, which a later cond's index must not have: cut it off.
            outs = [o if has_tangent(v.aval) else lax.stop_gradient(o) for v, o in zip(seg.outputs, outs)]
            env.update(zip(seg.outputs, outs))

    return run_level
