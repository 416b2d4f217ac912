"""Layer plans: the program cut into stages, each under ``jax.checkpoint`` with its own policy.

This is the plan a JAX user writes by hand, ``jax.checkpoint(layer, policy=...)``
around each layer, found on the traced program instead of in the user's code:
the stages are runs of equations of the flat jaxpr (a repeated layer, found
by :func:`remat_opt.solve._layers.layer_bounds`), and each stage gets a policy of
its own, so a plan can mix them (the last layers saving their matmuls, the
others nothing).

A stage's policy is one of JAX's built-in policies by name (a key of
:data:`remat_opt.rewrite._policies.POLICIES`), a tuple of names to save
(``save_only_these_names``: a MaxText recipe over the user's
``checkpoint_name``\\ s, or values of the program itself named as
:func:`remat_opt.program._names.value_name` names them), or ``None`` (the
stage runs as written). A stage under a tuple of names runs with every value
named (:func:`remat_opt.program._names.eval_named`), so either kind of name
can be saved.

``groups`` nests: each group of consecutive stages runs under one more
``jax.checkpoint`` saving nothing, around the stages' own. The forward then
keeps only a group's inputs; the group's backward reruns its stages, keeping
their inputs, and each stage's backward reruns the stage. Where the layers'
inputs are most of the memory a checkpoint per layer keeps, this keeps the
inputs of a group at a time.

``fenced`` puts each checkpointed stage (and group) behind the rewriter's fence
(:func:`remat_opt.rewrite._rewrite.fenced_checkpoint`), for a backend whose
compiler would merge a bare checkpoint's recomputation back into the forward
(XLA:CPU, docs/xla_findings.md §1). Where the compiler honours a bare
``jax.checkpoint`` (XLA:TPU, docs/xla_findings.md §9) the fence costs memory and time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.extend import core

from ..program._eval import eval_eqn, read_atom
from ..program._names import eval_named, parse_value_name
from ..program._trace import TracedProgram
from ._policies import POLICIES
from ._rewrite import fenced_checkpoint

StagePolicy = str | tuple[str, ...] | None
"""A built-in policy's name, the names to save, or ``None`` (as written)."""


@dataclass(frozen=True)
class LayerPlan:
    """Each stage ``[bounds[i], bounds[i + 1])`` of the flat program under ``policies[i]``.

    Attributes:
        bounds: equation positions where the stages start, then the program's end
            (``bounds[0] == 0``).
        policies: one per stage (see :data:`StagePolicy`).
        fenced: whether each checkpointed stage is fenced (see the module docstring).
        groups: ``(first, end)`` stage indices of each group run under a checkpoint of its own
            that saves nothing (see the module docstring); in order, not overlapping, each of
            two stages or more.
    """

    bounds: tuple[int, ...]
    policies: tuple[StagePolicy, ...]
    fenced: bool = False
    groups: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.policies) + 1 or list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"A layer plan needs increasing bounds, one more than its policies; "
                             f"got bounds {self.bounds} and {len(self.policies)} policies.")
        ends = [k for group in self.groups for k in group]
        if ends != sorted(ends) or any(end - first < 2 for first, end in self.groups) or \
                (ends and (ends[0] < 0 or ends[-1] > len(self.policies))):
            raise ValueError(f"A layer plan's groups are (first, end) stage indices, in order, not "
                             f"overlapping, each of two stages or more; got {self.groups}.")
        for policy in self.policies:
            if isinstance(policy, str) and policy not in POLICIES:
                raise ValueError(f"policy must be one of {sorted(POLICIES)}, a tuple of names or None; "
                                 f"got {policy!r}.")

    def __str__(self) -> str:
        counts = Counter(_label(p) for p in self.policies if p is not None)
        if not counts:
            return "the program as written"
        parts = ", ".join(f"{n} x {label}" for label, n in counts.items())
        nested = f", nested in {len(self.groups)} groups" if self.groups else ""
        return f"{sum(counts.values())} layers checkpointed{' (fenced)' if self.fenced else ''}: {parts}{nested}"


def _label(policy: StagePolicy) -> str:
    if isinstance(policy, tuple):
        if policy and all(parse_value_name(name) for name in policy):
            return f"save {len(policy)} chosen values"
        return f"save {', '.join(policy)}" if policy else "nothing_saveable"
    return str(policy)


def _policy(policy: StagePolicy) -> Callable[..., bool]:
    if isinstance(policy, tuple):
        return jax.checkpoint_policies.save_only_these_names(*policy)
    return POLICIES[str(policy)]


def _stage_io(jaxpr: core.Jaxpr, bounds: Sequence[int]) -> list[tuple[tuple[core.Var, ...], tuple[core.Var, ...]]]:
    """Per stage, the variables it reads from before it, and those it makes that are read after it."""
    read_after: set = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    io = []
    for lo, hi in reversed(list(zip(bounds[:-1], bounds[1:]))):
        made = {v for e in jaxpr.eqns[lo:hi] for v in e.outvars}
        reads = list(dict.fromkeys(v for e in jaxpr.eqns[lo:hi] for v in e.invars
                                   if isinstance(v, core.Var) and v not in made))
        outs = tuple(v for e in jaxpr.eqns[lo:hi] for v in e.outvars if v in read_after)
        io.append((tuple(reads), outs))
        read_after |= set(reads)
    return io[::-1]


def layer_program(traced: TracedProgram, plan: LayerPlan) -> Callable[..., list[Any]]:
    """The flat program of ``traced`` under ``plan``, as a function of its flat inputs.

    Raises:
        ValueError: ``plan.bounds`` does not end at the program's last equation.
    """
    closed = traced.jaxpr
    jaxpr = closed.jaxpr
    if plan.bounds[0] != 0 or plan.bounds[-1] != len(jaxpr.eqns):
        raise ValueError(f"The plan's bounds must run from 0 to {len(jaxpr.eqns)}; got {plan.bounds}.")
    io = _stage_io(jaxpr, plan.bounds)
    stages = []
    for (lo, hi), (reads, outs), policy in zip(zip(plan.bounds[:-1], plan.bounds[1:]), io, plan.policies):
        run = _stage_fn(jaxpr, lo, hi, reads, outs, named=isinstance(policy, tuple))
        if policy is not None:
            run = _checkpointed(run, _policy(policy), reads, traced.tangent_vars, plan.fenced)
        stages.append((run, reads, outs))
    stages = _nested(traced, plan, stages)

    def program(*flat_args: Any) -> list[Any]:
        env: dict = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, flat_args))
        for run, reads, outs in stages:
            env.update(zip(outs, run(*(env[v] for v in reads))))
        return [read_atom(env, v) for v in jaxpr.outvars]

    return program


def _nested(traced: TracedProgram, plan: LayerPlan, stages: list) -> list:
    """``stages`` (each ``(run, reads, outs)``) with each of ``plan.groups`` made one stage: its
    stages run in turn, under a checkpoint that saves nothing."""
    if not plan.groups:
        return stages
    starts = {first: end for first, end in plan.groups}
    merged = tuple(b for k, b in enumerate(plan.bounds)
                   if not any(first < k < end for first, end in plan.groups))
    io = iter(_stage_io(traced.jaxpr.jaxpr, merged))
    out, k = [], 0
    while k < len(stages):
        reads, outs = next(io)
        if k not in starts:
            out.append(stages[k])
            k += 1
            continue
        members, k = stages[k:starts[k]], starts[k]
        run = _checkpointed(_run_in_turn(members, reads, outs), POLICIES["nothing_saveable"], reads,
                            traced.tangent_vars, plan.fenced)
        out.append((run, reads, outs))
    return out


def _run_in_turn(members: list, reads: tuple, outs: tuple) -> Callable[..., tuple]:
    def run(*vals: Any) -> tuple:
        env = dict(zip(reads, vals))
        for member, member_reads, member_outs in members:
            env.update(zip(member_outs, member(*(env[v] for v in member_reads))))
        return tuple(env[v] for v in outs)

    return run


def _stage_fn(jaxpr: core.Jaxpr, lo: int, hi: int, reads: tuple, outs: tuple,
              named: bool) -> Callable[..., tuple]:
    def run(*vals: Any) -> tuple:
        env = dict(zip(reads, vals))
        if named:
            eval_named(jaxpr, env, lo, hi)
        else:
            for eqn in jaxpr.eqns[lo:hi]:
                env.update(zip(eqn.outvars, eval_eqn(eqn, [read_atom(env, v) for v in eqn.invars])))
        return tuple(env[v] for v in outs)

    return run


def _checkpointed(run: Callable[..., tuple], policy: Callable[..., bool], reads: tuple,
                  tangent_vars: frozenset, fenced: bool) -> Callable[..., tuple]:
    if not fenced:
        return jax.checkpoint(run, policy=policy)
    differentiable = tuple(v in tangent_vars for v in reads)
    if not any(differentiable):
        return run
    return fenced_checkpoint(run, (), differentiable, policy=policy)
