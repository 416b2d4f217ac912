"""``optimize`` and ``peak_bytes``: the library's entry points, their arguments checked at the boundary."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import InvalidOptionTypeError, short_repr
from ._inputs import check_argnums, check_call
from .planner._optimize import OptimizedFunction
from ._options import PlanOptions, budget_of
from .memory._measure import peak_bytes as measured_peak
from .program._cost import CostModel, Interconnect
from .solve._solve import SolverOptions


def optimize(
    fn: Callable[..., Any],
    budget_bytes: int | str,
    *,
    argnums: int | Sequence[int] = 0,
    solver_options: SolverOptions | None = None,
    max_attempts: int = 4,
    cost_model: CostModel | None = None,
    has_aux: bool = False,
    unroll_scans: int = 8,
    compute_saved_once: bool = True,
    xla_facts: bool = True,
    cache: bool | str | os.PathLike = True,
    interconnect: Interconnect | None = None,
    in_shardings: Any = None,
    objective: str = "auto",
) -> OptimizedFunction:
    """Places gradient checkpoints in ``fn`` so its gradient step fits ``budget_bytes``.

    Args:
        fn: the loss function, returning a scalar.
        budget_bytes: peak bytes for ``jax.jit(jax.value_and_grad(fn))`` as XLA
            measures it (see :func:`peak_bytes`); an int or a string such as
            ``"512MiB"`` or ``"2GB"``; or ``"device"``: the memory of the device
            the program runs on (``bytes_limit`` of its ``memory_stats()``; a TPU or
            GPU), for a step that does not fit at all. When the arguments are sharded over a
            mesh (``jax.Array`` with a ``NamedSharding``, or
            ``jax.ShapeDtypeStruct(..., sharding=...)``), the step is compiled
            with those shardings and the budget is one device's peak.
        argnums: positional arguments that are differentiated.
        solver_options: CP-SAT settings (time limit, workers, seed).
        max_attempts: solves allowed until XLA confirms the budget.
        cost_model: FLOPs per equation; the default counts dots and convs exactly.
        has_aux: ``fn`` returns ``(loss, aux)`` (as in ``jax.grad``); the step
            returns the same pair, for ``jax.value_and_grad(step, has_aux=True)``.
        unroll_scans: a ``lax.scan`` (or static ``fori_loop``) of at most this many
            iterations is unrolled into the plan, so checkpoints can fall between
            its iterations and inside its body, under the same budget. The
            rewritten step then has no loop: XLA compiles each iteration, which
            takes longer for long scans. ``0`` keeps every scan as one unit.
            Whatever this is, the scans' loop plans (what the body saves,
            chosen by CP-SAT; built-in policies on the body; iterations in
            checkpointed groups) are measured too, and the plan with the fewest
            recomputed FLOPs that fits wins. Longer scans stay loops by
            default, so planning them costs what compiling the loop costs,
            whatever the depth.
        compute_saved_once: in plans that save names, give each stored value
            XLA would rebuild in every reader from its operands (a residual
            stream) a reader XLA cannot fuse, so it computes the value once
            and frees the operands (:mod:`remat_opt.memory._once`). Same values and
            gradients; on the zoo's plans that save names, lower peaks or
            within a rounding of them (docs/measurements.md, "Stored values
            computed once"). ``False``
            leaves XLA to duplicate them as it likes.
        xla_facts: compile the program as written once more, with XLA's
            dump on, and read what the memory model takes from XLA
            (:mod:`remat_opt.memory._compiled`): what XLA did with the values
            of primitives no rule of the model names, the gradients it sums
            from partials held to the end, each transpose's scratch.
            ``False`` skips that compile: those values are guessed (as
            materialized) with a warning (:class:`UnknownPrimitiveWarning`),
            and the rest is left out.
        cache: keep plans on disk and load them in later processes
            (:mod:`remat_opt.cache._cache`): ``True`` for ``$REMAT_OPT_CACHE_DIR``, else
            ``~/.cache/remat_opt``; a folder; or ``False`` to plan every process
            anew. A loaded plan makes no solver call and compiles no candidate.
            On a mesh, the key holds each argument's sharding.
        interconnect: on a mesh, what a collective byte costs in FLOPs
            (:class:`Interconnect`; default 100 GB/s links, 100 TFLOP/s
            devices): recomputing an equation XLA lowered to a collective (an
            FSDP weight's all-gather) is charged its bytes at that rate.
        in_shardings: the arguments' layout on a mesh, as ``jax.jit`` takes it
            (a sharding per positional argument, or a pytree prefix of it):
            for calls on tracers or unplaced arrays, which carry none. Arrays
            already placed on a mesh need none. Under ``jax.jit`` without
            it, a call takes the plan made for the same shapes on a mesh by
            an earlier :meth:`~OptimizedFunction.plan` or call on the arrays.
        objective: what the plan minimises under the budget. ``"time"``: the step
            time on the device, by the step-time search (:mod:`remat_opt.planner._timed`):
            per-layer ``jax.checkpoint`` policies found on the program, mixes of
            them, the program as written and XLA's own rematerialization, each
            compiled and the fitting ones run; the fastest wins. ``"flops"``:
            recomputed FLOPs, by CP-SAT and the memory model. ``"auto"`` (the
            default): ``"time"`` on a TPU or GPU, ``"flops"`` on the CPU.

    Returns:
        An :class:`OptimizedFunction` with ``fn``'s signature and values.

    Raises:
        InvalidOptionTypeError: ``fn`` is not callable, or an option has the wrong type.
        InvalidOptionError: an option has a bad value (``max_attempts=0``).
        InvalidBudgetTypeError: ``budget_bytes`` has the wrong type.
        InvalidBudgetError: ``budget_bytes`` is not a positive size.
        InfeasibleBudgetError: (on first call) no plan fits on XLA, not even the
            lowest-memory one; carries ``min_budget_bytes``, a budget XLA confirms. Or, at
            once, the budget is under the step's arguments and outputs (``lower_bound``:
            ``min_budget_bytes`` is their bytes, which no plan goes under).

    Example:
        >>> import jax, jax.numpy as jnp, remat_opt
        >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w))
        >>> step = remat_opt.optimize(loss, budget_bytes="64MiB")
        >>> w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
        >>> bool(jnp.allclose(jax.grad(step)(w, x), jax.grad(loss)(w, x)))
        True
    """
    _check_callable(fn)
    options = PlanOptions(budget_of(budget_bytes), argnums=argnums, solver_options=solver_options,
                          max_attempts=max_attempts, cost_model=cost_model, has_aux=has_aux,
                          unroll_scans=unroll_scans, compute_saved_once=compute_saved_once, xla_facts=xla_facts,
                          cache=cache, interconnect=interconnect, in_shardings=in_shardings, objective=objective)
    return OptimizedFunction(fn, options)


def peak_bytes(
    fn: Callable[..., Any], *args: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False, **kwargs: Any
) -> int:
    """XLA's peak for one gradient step of ``fn`` on these arguments.

    Args:
        fn: a function returning a scalar.
        *args: positional arguments (arrays, pytrees, or ``jax.ShapeDtypeStruct``).
            Leaves that are not arrays (an Equinox module's functions, Python
            scalars) are static: closed over, not compiled inputs.
        argnums: the positional arguments differentiated, as in ``jax.grad``.
            Only their floating array leaves are, as in
            ``eqx.filter_value_and_grad`` (and ``jax.grad(..., allow_int=True)``).
        has_aux: ``fn`` returns ``(loss, aux)``, as in ``jax.grad``.
        **kwargs: keyword arguments, not differentiated.

    Returns:
        argument + output + temp − alias bytes of the compiled step.

    Raises:
        InvalidOptionTypeError: ``fn`` is not callable.
        RematOptError: as :func:`optimize`'s first call raises it for these arguments
            (``argnums`` out of range, nothing differentiable, no scalar loss...).

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> remat_opt.peak_bytes(lambda w: jnp.sum(jnp.tanh(w)), jnp.ones(1024)) > 0
        True
    """
    _check_callable(fn)
    check_argnums(argnums)
    check_call(fn, args, kwargs, argnums, has_aux)
    return measured_peak(fn, *args, argnums=argnums, has_aux=has_aux, **kwargs)


def _check_callable(fn: Any) -> None:
    if not callable(fn):
        raise InvalidOptionTypeError(f"fn must be callable; got {short_repr(fn)} ({type(fn).__name__}). Pass the loss "
                                     "function itself.", argument="fn", value=fn)
