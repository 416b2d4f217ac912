"""Loop plans: a ``lax.scan`` kept as a loop, its body and iterations checkpointed.

Unrolling a scan over layers (:mod:`remat_opt.program._trace`) lets CP-SAT place
checkpoints anywhere, but it costs what the loop gets for free: the unrolled
program splits the stacked inputs into per-iteration copies and concatenates
the per-iteration gradients at the end, where XLA's loop slices and updates
the stacked buffers in place. At tight budgets, the plans users write by hand
on the loop itself then win. A loop plan is one of them, chosen by
measurement:

* ``policy``: the scan body under ``jax.checkpoint`` with one of JAX's
  built-in policies (``None``: the body as written). XLA honours remat inside a
  loop body: the recomputation lives in the backward loop (docs/xla_findings.md §2).
* ``saved``: the scan body under ``jax.checkpoint`` with
  ``save_only_these_names(*saved)``, its values named as the graph names them
  (:mod:`remat_opt.program._names`, on the body flattened as
  :mod:`remat_opt.program._scan_body` flattens it): a saved set CP-SAT chose
  (:mod:`remat_opt.solve._body`), or names the user gave with ``checkpoint_name``.
* ``names``: the scan body, as written, under ``jax.checkpoint`` with
  ``save_only_these_names(*names)`` over the user's own ``checkpoint_name``s: a
  recipe (MaxText's ``remat_policy`` menu, :data:`remat_opt.rewrite._policies.NAME_RECIPES`,
  on the names the body carries; :func:`recipe_candidates`), exactly the program a user
  writes with it.
* ``chunks``: the iterations nested in ``chunks`` groups, each group an inner
  scan checkpointed whole, so the forward stores one carry per group and the
  backward recomputes one group at a time (Chen's sqrt(n) on a loop).

Every top-level scan of the program gets the same plan (nested only where
``chunks`` divides its length); scans inside a scan body are left alone.

A ``shard_map`` body is planned as a scan body of one iteration, per device
(:mod:`remat_opt.program._manual`): a plan that saves names (or applies a
built-in policy) runs the body behind the rewriter's fence
(:func:`remat_opt.rewrite._rewrite.fenced_checkpoint`) inside the same
``shard_map``. Unlike a loop's, a bare checkpoint there would be undone: the
partitioned body is straight-line code, which XLA merges and hoists as it
does any other (docs/xla_findings.md §1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax import lax
from jax.extend import core
from jax.extend.core import ClosedJaxpr

from ._policies import NAME_RECIPES, POLICIES
from ._rewrite import fenced_checkpoint
from ..program._names import eval_program
from ..program._manual import shard_map_body
from ..program._scan_body import flat_body
from ..program._eval import eval_eqn, replaced_program
from ..program._trace import TracedProgram, planned_bodies, scan_counts


@dataclass(frozen=True)
class LoopPlan:
    """How each scan of the program, kept as a loop, is checkpointed.

    Attributes:
        policy: a JAX built-in policy (a key of ``remat_opt.rewrite._policies.POLICIES``)
            applied to the scan body with ``jax.checkpoint``; ``None`` leaves the
            body as written.
        chunks: the iterations run as ``chunks`` groups, each an inner scan
            under ``jax.checkpoint`` that saves nothing (1: no nesting).
        saved: if set (``policy`` is then ``None``), the body runs under
            ``jax.checkpoint`` saving only the values of these names.
        body: what the planned body belongs to: ``"scan"``, or ``"shard_map"``
            (one call's body, per device; ``chunks`` is then 1).
        names: if set (``policy`` and ``saved`` are then ``None``), the body as written runs
            under ``jax.checkpoint`` saving only the values the user named so (``checkpoint_name``).
    """

    policy: str | None
    chunks: int = 1
    saved: tuple[str, ...] | None = None
    body: str = "scan"
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.policy, self.saved, self.names)) > 1:
            raise ValueError("A loop plan has one of a built-in policy, a saved set and the user's names, "
                             "not both or all.")

    def __str__(self) -> str:
        if self.names is not None:
            body = f"saving the names {', '.join(self.names)}"
        elif self.saved is not None:
            body = f"saving {len(self.saved)} named value{'s' if len(self.saved) != 1 else ''}"
        else:
            body = "as written" if self.policy is None else f"under {self.policy}"
        if self.body == "shard_map":
            return f"shard_map body per device {body}"
        nesting = "" if self.chunks == 1 else f", iterations in {self.chunks} checkpointed groups"
        return f"scan kept as a loop, body {body}{nesting}"


def planned_scans(traced: TracedProgram) -> list[int]:
    """Positions of the top-level scans that carry a tangent (the ones worth planning)."""
    return [i for i in planned_bodies(traced) if traced.jaxpr.jaxpr.eqns[i].primitive.name == "scan"]


def scan_lengths(traced: TracedProgram) -> list[int]:
    """Iteration counts of :func:`planned_scans`."""
    return [traced.jaxpr.jaxpr.eqns[i].params["length"] for i in planned_scans(traced)]


def near_sqrt_divisors(length: int, count: int = 2) -> list[int]:
    """The ``count`` divisors of ``length`` (other than 1 and itself) nearest sqrt(length):
    the group counts of Chen's sqrt(n) checkpointing on a loop."""
    divisors = [d for d in range(2, length) if length % d == 0]
    return sorted(divisors, key=lambda d: (abs(d - math.sqrt(length)), d))[:count]


def loop_candidates(lengths: Sequence[int]) -> list[LoopPlan]:
    """The loop plans worth measuring for scans of these lengths.

    Each built-in policy on the body, and the body as written, each without
    nesting and with the two group counts nearest sqrt(length) (the hand-written
    alternatives a user would try). The program as written, and
    ``everything_saveable`` without nesting (the same thing), are left out.
    """
    chunk_options = [1, *sorted({d for n in lengths for d in near_sqrt_divisors(n)})]
    plans = []
    for policy in (None, *POLICIES):
        for chunks in chunk_options:
            if chunks == 1 and policy in (None, "everything_saveable"):
                continue
            plans.append(LoopPlan(policy, chunks))
    return plans


def user_names(traced: TracedProgram) -> tuple[str, ...]:
    """The ``checkpoint_name``s the user gave values in the bodies of :func:`planned_scans`
    (inner calls included), in order of first appearance."""
    found: dict[str, None] = {}

    def visit(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "name" and isinstance(eqn.params.get("name"), str):
                found.setdefault(eqn.params["name"], None)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, (core.Jaxpr, ClosedJaxpr)):
                        visit(getattr(sub, "jaxpr", sub))

    for i in planned_scans(traced):
        visit(traced.jaxpr.jaxpr.eqns[i].params["jaxpr"].jaxpr)
    return tuple(found)


def recipe_candidates(names: Sequence[str]) -> list[LoopPlan]:
    """The name recipes a user of a body carrying ``names`` can write: each of
    :data:`~remat_opt.rewrite._policies.NAME_RECIPES` on the names present, and every name;
    none equal to saving nothing (a plan measured anyway), each set once."""
    present = set(names)
    sets = [tuple(n for n in recipe if n in present) for recipe in NAME_RECIPES.values()]
    sets.append(tuple(names))
    unique = dict.fromkeys(s for s in sets if s)
    return [LoopPlan(None, names=s) for s in unique]


def _planned_scan(eqn: core.JaxprEqn, invals: Sequence[Any], plan: LoopPlan,
                  named: ClosedJaxpr | None) -> list[Any]:
    """The scan ``eqn`` under ``plan``; ``named``: its body flattened, to run with every value
    named when ``plan`` saves names (``None`` otherwise)."""
    p = eqn.params
    (n_consts, n_carry), length, reverse = scan_counts(p), p["length"], p["reverse"]
    body_jaxpr: ClosedJaxpr = p["jaxpr"]
    consts = list(invals[:n_consts])
    carry, xs = tuple(invals[n_consts : n_consts + n_carry]), tuple(invals[n_consts + n_carry :])

    def body(c: tuple, x: tuple) -> tuple[tuple, tuple]:
        if named is not None:
            outs = eval_program(named, [*consts, *c, *x])
        else:
            outs = jax.core.eval_jaxpr(body_jaxpr.jaxpr, body_jaxpr.consts, *consts, *c, *x)
        return tuple(outs[:n_carry]), tuple(outs[n_carry:])

    if plan.policy is not None:
        body = jax.checkpoint(body, policy=POLICIES[plan.policy])
    elif plan.saved is not None:
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.save_only_these_names(*plan.saved))
    elif plan.names is not None:
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.save_only_these_names(*plan.names))
    chunks = plan.chunks if 1 < plan.chunks < length and length % plan.chunks == 0 else 1
    if chunks == 1:
        carry, ys = lax.scan(body, carry, xs, length=length, reverse=reverse)
        return [*carry, *ys]

    def group(c: tuple, xg: tuple) -> tuple[tuple, tuple]:
        return lax.scan(body, c, xg, length=length // chunks, reverse=reverse)

    grouped = tuple(x.reshape(chunks, length // chunks, *x.shape[1:]) for x in xs)
    carry, ys = lax.scan(
        jax.checkpoint(group, policy=jax.checkpoint_policies.nothing_saveable),
        carry, grouped, length=chunks, reverse=reverse,
    )
    return [*carry, *(y.reshape(length, *y.shape[2:]) for y in ys)]


def _planned_shard_map(eqn: core.JaxprEqn, invals: Sequence[Any], plan: LoopPlan, body: TracedProgram) -> list[Any]:
    """The ``shard_map`` ``eqn`` with ``plan`` on its body: behind the fence, saving ``plan.saved``
    (by the names of ``body``, the flat per-device body) or under ``plan.policy``."""
    if plan.policy is None and plan.saved is None:
        return eval_eqn(eqn, invals)

    def run(*args: Any) -> tuple:
        return tuple(eval_program(body.jaxpr, list(args)))

    policy = POLICIES[plan.policy] if plan.policy is not None else None
    fenced = fenced_checkpoint(run, plan.saved or (), body.differentiable, policy=policy)
    return list(body.manual.wrap(fenced, range(len(eqn.invars)), range(len(eqn.outvars)))(*invals))


def loop_program(traced: TracedProgram, plan: LoopPlan) -> Callable[..., list[Any]]:
    """The flat program of ``traced`` (scans not unrolled) with ``plan`` on its scans, or on its
    ``shard_map`` bodies when ``plan.body`` says so.

    Returns:
        A function of the flat inputs returning the flat outputs.
    """
    jaxpr = traced.jaxpr.jaxpr
    kind = plan.body
    planned = [i for i in planned_bodies(traced) if jaxpr.eqns[i].primitive.name == kind]
    # Flattened once, not at every trace of the program.
    if kind == "shard_map":
        bodies = {i: shard_map_body(traced, i) for i in planned}
        return replaced_program(traced.jaxpr, {
            i: functools.partial(_planned_shard_map, plan=plan, body=bodies[i]) for i in planned})
    named = {i: flat_body(jaxpr.eqns[i].params["jaxpr"]) for i in planned} if plan.saved is not None else {}
    return replaced_program(traced.jaxpr, {
        i: functools.partial(_planned_scan, plan=plan, named=named.get(i)) for i in planned})
