"""Baseline strategies, measured the same way and returned as the same :class:`Plan`.

Each strategy is one public function that takes what it is measured with (a
:class:`~remat_opt.BaselineCall`: the function, its arguments, the budget),
builds its program, measures it on XLA (:func:`remat_opt.peak_bytes`) and counts
its FLOPs on the jaxpr, exactly as :func:`remat_opt.optimize` does for its own
plans, so that the two can be put in one table:

* :func:`no_remat` — the function as written.
* :func:`checkpoint_policy` — ``jax.checkpoint(fn, policy=...)`` around the
  whole function, with one of JAX's built-in policies (:data:`POLICIES`).
* :func:`layer_checkpoint_policy` — the same around each layer, through the
  model's ``layer_wrapper`` (the zoo's convention).
* :func:`megatron_selective` — Megatron-LM's selective activation recompute.
* :func:`chen_sqrt_n` and :func:`chen_greedy` — Chen et al.'s segment
  checkpointing, as a :class:`Schedule` on the program graph, run through the
  fenced rewriter.
* :func:`revolve` — Griewank's binomial checkpointing on the program's chain,
  as nested fenced checkpoints.

The JAX-policy baselines use plain ``jax.checkpoint`` exactly as a user would
write it: on XLA:CPU it is often undone by CSE and scheduling (docs/xla_findings.md §1),
and showing that is part of the point. Their plans carry no model prediction
(``predicted_peak_bytes`` and ``schedule`` are ``None``); their
``recompute_flops`` is the measured figure.

Example:
    >>> import jax, jax.numpy as jnp, remat_opt
    >>> from remat_opt.baselines import BaselineCall
    >>> loss = lambda ws, x: jnp.sum(jnp.tanh(jnp.tanh(x @ ws[0]) @ ws[1]))
    >>> ws, x = [jnp.ones((8, 8)) / 8] * 2, jnp.ones((4, 8))
    >>> plan = remat_opt.checkpoint_policy(BaselineCall(loss, (ws, x), budget_bytes="1MiB"), "nothing_saveable")
    >>> plan.strategy, plan.measured_recompute_flops > 0
    ('checkpoint/nothing_saveable', True)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from ..solve._baseline_picks import MEASURE_TOP, greedy_picks, lowest_predicted
from ..solve._chen import chen_sqrt_n_schedule
from ..solve._nesting import MAX_DEPTH, chain_steps, revolve_schedule, revolve_schedules
from ..rewrite._apply import apply_schedule
from .._plan import Plan
from ..rewrite._policies import POLICIES, layer_policy_program, policy_program
from ._reference import BaselineCall, Reference, policy_plan, reference, schedule_plan
from .._schedule import Schedule


def _check_positive(argument: str, value: object, *, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "a positive int" + (" or None" if allow_none else "")
        raise ValueError(f"{argument} must be {expected}; got {value!r}.")


def _no_remat(ref: Reference) -> Plan:
    return schedule_plan(ref, "no_remat", Schedule(plain=True), measured=ref.plain_peak_bytes)


def _chen_sqrt_n(ref: Reference, num_segments: int | None) -> Plan:
    start = time.perf_counter()
    schedule = chen_sqrt_n_schedule(ref.graph, num_segments)
    return schedule_plan(ref, "chen_sqrt_n", schedule, solve_seconds=time.perf_counter() - start)


def _chen_greedy(ref: Reference, measure_top: int) -> Plan:
    start = time.perf_counter()
    ranked = greedy_picks(ref.graph, measure_top)
    seconds = time.perf_counter() - start
    measured = [(ref.peak(apply_schedule(ref.fn, ref.graph, s)), len(s.cuts), s) for s in ranked]
    peak, _, best = min(measured, key=lambda t: (t[0], t[1]))
    return schedule_plan(ref, "chen_greedy", best, measured=peak, solve_seconds=seconds, attempts=len(measured))


def _revolve(ref: Reference, snapshots: int | None, measure_top: int) -> Plan:
    start = time.perf_counter()
    if snapshots is None:
        schedules = revolve_schedules(ref.graph)
    else:
        schedules = tuple(s for s in (revolve_schedule(ref.graph, snapshots),) if s is not None)
    if not schedules:
        raise ValueError(f"snapshots={snapshots} cannot reverse this program's chain of "
                         f"{len(chain_steps(ref.graph)) - 1} steps within {MAX_DEPTH} levels; pass more snapshots.")
    ranked = lowest_predicted(ref.graph, schedules, measure_top)
    seconds = time.perf_counter() - start
    measured = [(ref.peak(apply_schedule(ref.fn, ref.graph, s)), i, s) for i, s in enumerate(ranked)]
    peak, _, best = min(measured, key=lambda t: t[:2])
    return schedule_plan(ref, "revolve", best, measured=peak, solve_seconds=seconds, attempts=len(measured))


# --------------------------------------------------------------------------- public API


def no_remat(call: BaselineCall) -> Plan:
    """The function as written: no rematerialization.

    Args:
        call: the function, its arguments, the budget the plan is compared against
            (``plan.fits``), what is differentiated and how FLOPs are counted.

    Returns:
        A measured :class:`Plan` with ``strategy="no_remat"``, zero recompute,
        and the model's prediction for the plain program.

    Raises:
        TypeError: ``call.fn`` is not callable, or an argument has the wrong type.
        ValueError: ``call.budget_bytes`` or ``call.argnums`` is invalid.

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> w = jnp.ones((8, 8))
        >>> remat_opt.no_remat(BaselineCall(lambda w: jnp.sum(jnp.tanh(w @ w)), (w,), budget_bytes="1MiB")).fits
        True
    """
    return _no_remat(reference(call))


def checkpoint_policy(call: BaselineCall, policy: str) -> Plan:
    """``jax.checkpoint(fn, policy=...)`` around the whole function ``call.fn``.

    Args:
        call: the function, its arguments and the budget the plan is compared against.
        policy: a name in :data:`POLICIES` (``"nothing_saveable"``,
            ``"dots_saveable"``, ``"dots_with_no_batch_dims_saveable"``,
            ``"everything_saveable"``).

    Returns:
        A measured :class:`Plan` with ``strategy="checkpoint/<policy>"`` and no
        prediction (``predicted_peak_bytes`` and ``schedule`` are ``None``).

    Raises:
        ValueError: ``policy`` is not a known name, or another argument is invalid.
        TypeError: ``call.fn`` is not callable.

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> loss = lambda w: jnp.sum(jnp.tanh(jnp.tanh(w @ w) @ w))
        >>> call = BaselineCall(loss, (jnp.ones((8, 8)),), budget_bytes=1 << 20)
        >>> remat_opt.checkpoint_policy(call, "dots_saveable").status
        'BASELINE'
    """
    program = policy_program(call.fn, policy)
    ref = reference(call)
    return policy_plan(ref, f"checkpoint/{policy}", program)


def layer_checkpoint_policy(call: BaselineCall, policy: str) -> Plan:
    """``jax.checkpoint(layer, policy=...)`` around each layer of the loss ``call.fn``.

    The loss must take the zoo's ``layer_wrapper`` keyword (see
    :mod:`remat_opt.zoo`): it is called with
    ``layer_wrapper=lambda f: jax.checkpoint(f, policy=...)``.

    Args:
        call: the loss (taking ``layer_wrapper``), its arguments and the budget the
            plan is compared against.
        policy: a name in :data:`POLICIES`.

    Returns:
        A measured :class:`Plan` with ``strategy="layer_checkpoint/<policy>"``
        and no prediction.

    Raises:
        TypeError: the loss takes no ``layer_wrapper``.
        ValueError: ``policy`` is not a known name, or another argument is invalid.

    Example:
        >>> import jax, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> from remat_opt.zoo import MODELS, MLPConfig
        >>> spec = MODELS["mlp"]
        >>> params, batch = spec.init(MLPConfig(depth=2, width=8, batch=4), jax.random.key(0))
        >>> call = BaselineCall(spec.loss, (params, batch), budget_bytes="1MiB")
        >>> remat_opt.layer_checkpoint_policy(call, "nothing_saveable").strategy
        'layer_checkpoint/nothing_saveable'
    """
    program = layer_policy_program(call.fn, policy)
    ref = reference(call)
    return policy_plan(ref, f"layer_checkpoint/{policy}", program)


def megatron_selective(call: BaselineCall) -> Plan:
    """Megatron-LM selective activation recompute, as JAX expresses it.

    Megatron keeps each layer's linear-layer outputs and recomputes the
    attention core (``Q Kᵀ``, softmax, dropout, the product with ``V``): the
    part whose activations grow with ``seq_len²`` but cost few FLOPs. In JAX
    this is ``jax.checkpoint(layer, policy=dots_with_no_batch_dims_saveable)``
    per layer: the projections are dots without batch dimensions and are saved;
    ``Q Kᵀ`` and ``probs @ V`` are batched dots (over batch and heads) and are
    recomputed. One difference: the policy also recomputes the layer's cheap
    elementwise values (layer norms, GELU), which Megatron keeps; so this uses
    slightly less memory and slightly more FLOPs than Megatron would. The
    program is the same as :func:`layer_checkpoint_policy` with that policy.

    Args:
        call: the loss (taking the zoo's ``layer_wrapper``), its arguments and the
            budget the plan is compared against.

    Returns:
        A measured :class:`Plan` with ``strategy="megatron_selective"``.

    Raises:
        TypeError: the loss takes no ``layer_wrapper``.

    References:
        V. Korthikanti, J. Casper, S. Lym, L. McAfee, M. Andersch, M. Shoeybi,
        B. Catanzaro. Reducing Activation Recomputation in Large Transformer
        Models. arXiv:2205.05198, 2022 (Section 4.2, selective recomputation).

    Example:
        >>> import jax, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> from remat_opt.zoo import MODELS, GPTConfig
        >>> spec = MODELS["gpt"]
        >>> config = GPTConfig(num_layers=1, d_model=16, num_heads=2, seq_len=8, batch=1, vocab=16)
        >>> params, batch = spec.init(config, jax.random.key(0))
        >>> remat_opt.megatron_selective(BaselineCall(spec.loss, (params, batch), budget_bytes="1MiB")).strategy
        'megatron_selective'
    """
    program = layer_policy_program(call.fn, "dots_with_no_batch_dims_saveable")
    ref = reference(call)
    return policy_plan(ref, "megatron_selective", program)


def chen_sqrt_n(call: BaselineCall, *, num_segments: int | None = None) -> Plan:
    """Chen et al.'s sqrt(n) checkpointing, run through remat_opt's fenced rewriter.

    See :func:`chen_sqrt_n_schedule` for where the cuts go. Each segment's
    backward recomputes the whole segment from its stored inputs, fenced so
    that XLA keeps the recomputation in the backward pass.

    Args:
        call: the function, its arguments and the budget the plan is compared against.
        num_segments: ``k``; ``None`` for ``round(sqrt(n))`` over the ``n``
            primal equations.

    Returns:
        A measured :class:`Plan` with ``strategy="chen_sqrt_n"``, its schedule
        and the model's prediction.

    Raises:
        ValueError: ``num_segments`` is not a positive int, or another argument is invalid.

    References:
        T. Chen, B. Xu, C. Zhang, C. Guestrin. Training Deep Nets with Sublinear
        Memory Cost. arXiv:1604.06174, 2016.

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> def loss(w, x):
        ...     for _ in range(4):
        ...         x = jnp.tanh(x @ w)
        ...     return jnp.sum(x)
        >>> call = BaselineCall(loss, (jnp.ones((8, 8)), jnp.ones((4, 8))), budget_bytes="1MiB")
        >>> remat_opt.chen_sqrt_n(call).num_segments > 1
        True
    """
    _check_positive("num_segments", num_segments, allow_none=True)
    return _chen_sqrt_n(reference(call), num_segments)


def chen_greedy(call: BaselineCall, *, measure_top: int = MEASURE_TOP) -> Plan:
    """Chen et al.'s greedy checkpointing, with its segment budget searched.

    Every distinct schedule of :func:`chen_greedy_candidates` is simulated;
    the ``measure_top`` with the lowest predicted peak are measured on XLA and
    the lowest measured one is returned (ties: fewer segments).

    Args:
        call: the function, its arguments and the budget the plan is compared against.
        measure_top: how many candidates to compile and measure.

    Returns:
        A measured :class:`Plan` with ``strategy="chen_greedy"``; ``attempts``
        is the number of candidates measured.

    Raises:
        ValueError: ``measure_top`` is not a positive int, or another argument is invalid.

    References:
        T. Chen, B. Xu, C. Zhang, C. Guestrin. Training Deep Nets with Sublinear
        Memory Cost. arXiv:1604.06174, 2016 (greedy planning with a budget).

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> def loss(w, x):
        ...     for _ in range(4):
        ...         x = jnp.tanh(x @ w)
        ...     return jnp.sum(x)
        >>> call = BaselineCall(loss, (jnp.ones((8, 8)), jnp.ones((4, 8))), budget_bytes="1MiB")
        >>> remat_opt.chen_greedy(call).strategy
        'chen_greedy'
    """
    _check_positive("measure_top", measure_top)
    return _chen_greedy(reference(call), measure_top)


def revolve(call: BaselineCall, *, snapshots: int | None = None, measure_top: int = MEASURE_TOP) -> Plan:
    """Griewank's Revolve (binomial checkpointing), as nested fenced checkpoints.

    The program's chain (:func:`remat_opt.solve._nesting.chain_steps`: its
    articulation positions, at most :data:`~remat_opt.solve._nesting.MAX_STEPS`
    steps) is reversed with ``snapshots`` stored states and one taped step
    at a time, recomputing the fewest FLOPs (Griewank & Walther's recursion,
    each step weighted by its FLOPs). A segment whose reversal needs states
    of its own is a checkpoint inside a checkpoint, fenced like every
    segment, at most :data:`~remat_opt.solve._nesting.MAX_DEPTH` levels deep.

    Args:
        call: the function, its arguments and the budget the plan is compared against.
        snapshots: stored states; ``None`` for the lowest-memory choice: the
            ``measure_top`` schedules of all snapshot counts with the lowest
            predicted peak are measured and the lowest measured is returned.
        measure_top: how many schedules to compile and measure when
            ``snapshots`` is ``None``.

    Returns:
        A measured :class:`Plan` with ``strategy="revolve"``, its nested
        schedule and the model's prediction.

    Raises:
        ValueError: ``snapshots`` or ``measure_top`` is not a positive int, or
            ``snapshots`` is too few for the chain within the depth limit.

    References:
        A. Griewank, A. Walther. Algorithm 799: Revolve: An Implementation of
        Checkpointing for the Reverse or Adjoint Mode of Computational
        Differentiation. ACM TOMS 26(1), 2000.

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> def loss(w, x):
        ...     for _ in range(8):
        ...         x = jnp.tanh(x @ w)
        ...     return jnp.sum(x)
        >>> call = BaselineCall(loss, (jnp.ones((8, 8)), jnp.ones((4, 8))), budget_bytes="1MiB")
        >>> plan = remat_opt.revolve(call, snapshots=4)
        >>> plan.strategy, plan.schedule.depth() > 1
        ('revolve', True)
    """
    _check_positive("snapshots", snapshots, allow_none=True)
    _check_positive("measure_top", measure_top)
    return _revolve(reference(call), snapshots, measure_top)


def all_baselines(
    call: BaselineCall, *, policies: Sequence[str] = tuple(POLICIES), measure_top: int = MEASURE_TOP
) -> tuple[Plan, ...]:
    """Every baseline of one call, its loss taking the zoo's ``layer_wrapper`` (a zoo
    model's ``spec.loss`` on ``(params, batch)``, or any loss taking ``layer_wrapper=None``).

    The plain program is traced, measured and counted once and shared by all.

    Args:
        call: the loss, its arguments and the budget every plan is compared against.
        policies: the JAX policies to run, whole-function and per layer.
        measure_top: candidates :func:`chen_greedy` and :func:`revolve` measure.

    Returns:
        Plans in this order: ``no_remat``; ``checkpoint/<policy>`` for each
        policy; ``layer_checkpoint/<policy>`` for each policy;
        ``fenced_layer_checkpoint/<policy>`` for each policy (the same, with
        remat_opt's fence around each layer's backward); ``megatron_selective``;
        ``chen_sqrt_n``; ``chen_greedy``; ``revolve``.

    Raises:
        TypeError: the loss is not a callable taking ``layer_wrapper``.

    Example:
        >>> import jax, remat_opt
        >>> from remat_opt.baselines import BaselineCall
        >>> from remat_opt.zoo import MODELS, MLPConfig
        >>> spec = MODELS["mlp"]
        >>> params, batch = spec.init(MLPConfig(depth=2, width=8, batch=4), jax.random.key(0))
        >>> call = BaselineCall(spec.loss, (params, batch), budget_bytes="1MiB")
        >>> plans = remat_opt.all_baselines(call, policies=("nothing_saveable",))
        >>> [p.strategy for p in plans][:2]
        ['no_remat', 'checkpoint/nothing_saveable']
    """
    _check_positive("measure_top", measure_top)
    loss = call.fn
    layer_programs = {policy: layer_policy_program(loss, policy) for policy in policies}
    ref = reference(call)
    plans = [_no_remat(ref)]
    plans += [policy_plan(ref, f"checkpoint/{p}", policy_program(loss, p)) for p in policies]
    plans += [policy_plan(ref, f"layer_checkpoint/{p}", prog) for p, prog in layer_programs.items()]
    plans += [policy_plan(ref, f"fenced_layer_checkpoint/{p}", layer_policy_program(loss, p, fenced=True))
              for p in policies]
    same = "layer_checkpoint/dots_with_no_batch_dims_saveable"
    megatron = next((p for p in plans if p.strategy == same), None)
    if megatron is not None:  # The same program: measured once.
        plans.append(replace(megatron, strategy="megatron_selective"))
    else:
        program = layer_policy_program(loss, "dots_with_no_batch_dims_saveable")
        plans.append(policy_plan(ref, "megatron_selective", program))
    plans.append(_chen_sqrt_n(ref, None))
    plans.append(_chen_greedy(ref, measure_top))
    plans.append(_revolve(ref, None, measure_top))
    return tuple(plans)
