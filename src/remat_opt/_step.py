"""``optimize_step``: a budget for the whole training step, not only the loss's gradient.

A user's device holds the whole step: the parameters and the optimizer's
state (often donated), the batch, the loss's forward and backward, and the
optimizer's update. ``optimize`` budgets only ``jax.jit(jax.value_and_grad(loss))``.
This module plans the loss so that the user's own step, written around it and
jitted with its donations, peaks at or under the budget on XLA.

The step is a function of the loss (``make_step(loss) -> step``), so the same
step can be built around the loss as written and around the planned one. The
budget is split and then checked, XLA judging both ends:

1. ``make_step`` is traced around a loss that records its arguments: their
   shapes and dtypes inside the step are what the loss is planned for.
2. The step's *overhead* is XLA's peak for the whole step with the loss as
   written, less XLA's peak for the loss's gradient step alone (what
   ``optimize`` budgets): the optimizer's state and update, less what
   donation gives back.
3. The loss is planned by ``optimize`` under the budget less the overhead.
4. The whole step around the planned loss is compiled and its peak measured;
   the step's peak less the loss's is what the rest of the step takes around
   this plan, which is not the overhead (around a planned loss it is often
   less: docs/design.md, "The whole training step"). The next loss budget is the
   budget less that: over the budget, also less the overshoot and a margin;
   under it, with the loss recomputing something, it is loosened, so a
   cheaper plan may fit (never up to a loss budget whose step was over). A
   loss budget below the loss's reach is raised to the lowest the loss
   confirms: the step around that plan may still fit. Up to
   ``step_attempts`` plans; of the steps XLA measured at or under the budget,
   the one whose loss recomputes the fewest FLOPs is returned, never one
   measured over.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from ._api import optimize
from ._budget import format_bytes, parse_bytes
from ._errors import InfeasibleBudgetError, InvalidOptionError, InvalidOptionTypeError, short_repr
from .planner._optimize import OptimizedFunction
from ._options import check_count
from ._plan import Plan, measured_peak_of
from .memory._compiles import peak_as_jit_compiles
from .memory._measure import abstract, memory_of, peak_bytes

logger = logging.getLogger("remat_opt")

RETRY_MARGIN = 100
"""After a step over the budget, the next loss budget is under by 1/RETRY_MARGIN of the budget more."""

RELAX_SLACK = 0.02
"""A step that fits is planned again under a looser loss budget when that is looser by more
than this share of the budget."""


@dataclasses.dataclass(frozen=True)
class OptimizedStep:
    """The user's training step around a planned loss, jitted, its peak on XLA within the budget.

    Call it as the step: ``params, opt_state, loss = opt_step(params, opt_state, batch)``.

    Attributes:
        step: ``jax.jit(make_step(loss), donate_argnums=donate_argnums)``.
        loss: the planned loss (an :class:`~remat_opt.OptimizedFunction`), as the step calls it.
        plan: ``loss``'s :class:`~remat_opt.Plan` for the arguments the step passes it.
        budget_bytes: the whole step's budget.
        measured_peak_bytes: XLA's peak for ``step`` (argument + output + temp − alias).
        plain_peak_bytes: XLA's peak for the step around the loss as written.
        overhead_bytes: ``plain_peak_bytes`` less XLA's peak for the loss's gradient step alone.
        loss_budget_bytes: the budget ``loss`` was planned under.
        attempts: how many times the loss was planned.
    """

    step: Callable[..., Any]
    loss: OptimizedFunction
    plan: Plan
    budget_bytes: int
    measured_peak_bytes: int
    plain_peak_bytes: int
    overhead_bytes: int
    loss_budget_bytes: int
    attempts: int

    def __call__(self, *args: Any) -> Any:
        return self.step(*args)


def optimize_step(
    make_step: Callable[[Callable[..., Any]], Callable[..., Any]],
    loss_fn: Callable[..., Any],
    budget_bytes: int | str,
    *step_args: Any,
    donate_argnums: int | Sequence[int] = (),
    step_attempts: int = 4,
    **optimize_options: Any,
) -> OptimizedStep:
    """Plans ``loss_fn`` so that the whole training step ``make_step(loss)`` fits ``budget_bytes``.

    Args:
        make_step: builds the training step around a loss: ``make_step(loss)``
            returns ``step(*step_args)``, which calls ``loss`` (for instance
            through ``jax.value_and_grad``) and applies the update.
        loss_fn: the loss as written; what ``make_step`` receives when the step
            is measured as written.
        budget_bytes: peak bytes for ``jax.jit(make_step(loss), donate_argnums=...)``
            on ``step_args`` as XLA measures it (argument + output + temp − alias of
            ``memory_analysis()``); an int or a string such as ``"512MiB"``.
        *step_args: the step's positional arguments (arrays, pytrees of arrays or
            ``jax.ShapeDtypeStruct``); only their shapes and dtypes are used.
        donate_argnums: the step's donated arguments, as in ``jax.jit``.
        step_attempts: loss plans allowed until XLA confirms the whole step.
        **optimize_options: passed to :func:`remat_opt.optimize` (``argnums``,
            ``has_aux``, ``solver_options``, ...): they must describe how the step
            differentiates the loss.

    Returns:
        An :class:`OptimizedStep`: the jitted step around the planned loss (call it
        as the step), the planned loss and its plan, and the figures XLA measured.

    Raises:
        TypeError: ``make_step`` or ``loss_fn`` is not callable, ``budget_bytes`` or
            ``donate_argnums`` has the wrong type, or an option is unknown.
        ValueError: ``budget_bytes`` is not a positive size, ``donate_argnums`` is
            out of range, ``step_attempts < 1``, or the step never calls its loss.
        InfeasibleBudgetError: no plan of the loss brings the whole step under the
            budget; ``min_budget_bytes`` is the lowest whole-step peak XLA measured.

    Example:
        >>> import jax, jax.numpy as jnp, remat_opt
        >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w))
        >>> def make_step(loss):
        ...     def step(w, x):
        ...         value, g = jax.value_and_grad(loss)(w, x)
        ...         return w - 0.1 * g, value
        ...     return step
        >>> w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
        >>> opt_step = remat_opt.optimize_step(make_step, loss, "64MiB", w, x, donate_argnums=0)
        >>> opt_step.measured_peak_bytes <= opt_step.budget_bytes
        True
    """
    if not callable(make_step):
        raise InvalidOptionTypeError(f"make_step must be callable; got {short_repr(make_step)}. "
                                     "Pass a function of the loss "
                                     "that returns the training step.", argument="make_step", value=make_step)
    budget = parse_bytes(budget_bytes, argument="budget_bytes")
    donate = _donate_argnums(donate_argnums, len(step_args))
    check_count("step_attempts", step_attempts, 1)
    optimize(loss_fn, budget, **optimize_options)  # checks loss_fn and the options before any compile
    args = abstract(step_args)
    loss_args, loss_kwargs = loss_arguments(make_step, loss_fn, args)
    step = _Step(make_step, loss_fn, args, donate, loss_args, loss_kwargs, optimize_options)
    plain_step = step.peak(loss_fn)
    plain_loss = peak_bytes(loss_fn, *loss_args, argnums=optimize_options.get("argnums", 0),
                            has_aux=optimize_options.get("has_aux", False), **loss_kwargs)
    overhead = plain_step - plain_loss
    logger.info("whole step: plain peak %s on XLA, %s of it besides the loss's gradient step; budget %s",
                format_bytes(plain_step), format_bytes(overhead), format_bytes(budget))
    tried = step.search(budget, budget - overhead, step_attempts)
    fitting = [t for t in tried if t.peak <= budget]
    if fitting:
        best = min(fitting, key=lambda t: (_flops(t.plan), t.peak))
        return OptimizedStep(jax.jit(make_step(best.loss), donate_argnums=donate), best.loss, best.plan, budget,
                             best.peak, plain_step, overhead, best.loss_budget, len(tried))
    lowest = min(tried, key=lambda t: t.peak, default=None)
    if lowest is None:  # the loss's lowest plan did not hold at its own figure: the step as written does
        raise InfeasibleBudgetError(budget, plain_step, detail="(No plan of the loss under the budget less "
                                    "the rest of the step was made; the step as written peaks there.)")
    raise InfeasibleBudgetError(budget, lowest.peak, detail=(
        f"(XLA measured the whole step at {lowest.peak:,} bytes around the loss planned under "
        f"{lowest.loss_budget:,}, the lowest of {len(tried)} plan(s); around the loss as written it "
        f"peaks at {plain_step:,}.)"))


def loss_arguments(make_step: Callable[..., Any], loss_fn: Callable[..., Any], step_args: tuple) -> tuple[tuple, dict]:
    """The shapes and dtypes (``jax.ShapeDtypeStruct``) of the arguments the step
    passes its loss, read by tracing ``make_step`` around a loss that records
    them (abstractly: nothing is computed). The first call's, if several."""
    calls: list[tuple[tuple, dict]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(abstract((args, kwargs)))
        return loss_fn(*args, **kwargs)

    jax.eval_shape(make_step(recording), *step_args)
    if not calls:
        raise InvalidOptionError(f"make_step={make_step!r} built a step that never calls the loss it is given; "
                                 "make_step(loss) must return a step that computes loss (for instance through "
                                 "jax.value_and_grad(loss)).", argument="make_step", value=make_step)
    return calls[0]


def step_peak_bytes(make_step: Callable[..., Any], loss: Callable[..., Any], step_args: tuple,
                    donate_argnums: tuple[int, ...]) -> int:
    """XLA's peak for ``jax.jit(make_step(loss), donate_argnums=...)`` on ``step_args``:
    argument + output + temp − alias bytes (donated arguments are aliased)."""
    lowered = jax.jit(make_step(loss), donate_argnums=donate_argnums).lower(*step_args)
    return peak_as_jit_compiles(lowered, lambda low: memory_of(low.compile()))


def _donate_argnums(donate_argnums: Any, num_args: int) -> tuple[int, ...]:
    nums = (donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums
    if (isinstance(donate_argnums, bool) or not isinstance(nums, (tuple, list))
            or any(isinstance(n, bool) or not isinstance(n, int) for n in nums)):
        raise InvalidOptionTypeError(f"donate_argnums must be an int or a tuple of ints, as in jax.jit; got "
                                     f"{donate_argnums!r}.", argument="donate_argnums", value=donate_argnums)
    if any(not -num_args <= n < num_args for n in nums):
        raise InvalidOptionError(f"donate_argnums={donate_argnums!r} is out of range for a step of {num_args} "
                                 f"argument(s) (step_args); use indices in [0, {num_args}).",
                                 argument="donate_argnums", value=donate_argnums)
    return tuple(sorted({n % num_args for n in nums}))


@dataclasses.dataclass(frozen=True)
class _Step:
    """The user's step and what is known of its loss: builds, plans and measures."""

    make_step: Callable[..., Any]
    loss_fn: Callable[..., Any]
    args: tuple  # the step's arguments, abstract
    donate: tuple[int, ...]
    loss_args: tuple  # the loss's arguments inside the step, abstract
    loss_kwargs: dict
    options: dict  # for optimize

    def peak(self, loss: Callable[..., Any]) -> int:
        return step_peak_bytes(self.make_step, loss, self.args, self.donate)

    def planned_loss(self, loss_budget: int) -> tuple[OptimizedFunction, Plan]:
        loss = optimize(self.loss_fn, loss_budget, **self.options)
        return loss, loss.plan(*self.loss_args, **self.loss_kwargs)

    def search(self, budget: int, loss_budget: int, attempts: int) -> list[_Attempt]:
        """The loss planned under ``loss_budget`` and the whole step measured, then
        again under a loss budget steered by what XLA measured, up to ``attempts``
        plans (see the module's docstring)."""
        tried: list[_Attempt] = []
        fits_at, over_at = None, None  # the loosest loss budget whose step fit; the tightest whose step was over
        floor = 1  # the lowest loss budget the loss confirms, once one was out of its reach
        while len(tried) < attempts:
            if loss_budget < floor:  # below the loss's reach: its lowest plan, once
                if any(t.loss_budget == floor for t in tried):
                    break
                loss_budget = floor
            try:
                loss, plan = self.planned_loss(loss_budget)
            except InfeasibleBudgetError as err:
                if err.min_budget_bytes <= loss_budget:
                    break  # the loss's own figure did not hold: nothing lower to try
                floor = err.min_budget_bytes
                continue
            peak = self.peak(loss)
            tried.append(_Attempt(loss_budget, loss, plan, peak))
            logger.info("step attempt %d/%d: loss planned under %s, measured %s; whole step measured %s",
                        len(tried), attempts, format_bytes(loss_budget), format_bytes(measured_peak_of(plan)),
                        format_bytes(peak))
            target = budget - (peak - measured_peak_of(plan))  # the budget less the rest of the step, here
            if peak <= budget:
                fits_at = max(fits_at or 0, loss_budget)
                if _flops(plan) == 0 or target - loss_budget <= budget * RELAX_SLACK:
                    break
                if over_at is not None:
                    target = min(target, (fits_at + over_at) // 2)
            else:
                over_at = min(over_at or loss_budget, loss_budget)
                target = min(target, loss_budget - (peak - budget)) - budget // RETRY_MARGIN
                if fits_at is not None:
                    target = max(target, (fits_at + over_at) // 2)
            if any(t.loss_budget == max(floor, target) for t in tried):
                break  # planned there already
            loss_budget = target
        return tried


class _Attempt(NamedTuple):
    loss_budget: int
    loss: OptimizedFunction
    plan: Plan
    peak: int  # XLA's, for the whole step


def _flops(plan: Plan) -> int:
    """The FLOPs the plan recomputes, as counted on its rewritten jaxpr where it was."""
    return plan.measured_recompute_flops if plan.measured_recompute_flops is not None else plan.recompute_flops
