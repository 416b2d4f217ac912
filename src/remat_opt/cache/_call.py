"""One question to the planner: a function, the arguments of one call, and the options.

:class:`Call` is what the planner (:mod:`remat_opt.planner._optimize`) and the plan cache
(:mod:`remat_opt.cache._restore`) pass along instead of the arguments, their argnums and the
options one by one. It traces the function (scans whole) and makes the plan's key once,
whoever asks first.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from ._cache import derivative_text, layout_of, options_of, plan_key
from .._options import PlanOptions
from ..memory._measure import StepCall
from ..program._trace import TracedProgram, grad_argnums, normalize_argnums, trace


@dataclasses.dataclass(frozen=True, eq=False)
class Call:
    """``fn`` called on ``args`` and ``kwargs`` (arrays or their shapes: a plan is per
    signature), to be planned under ``options``.

    Attributes:
        fn: the user's function.
        args: positional arguments (arrays, ``jax.ShapeDtypeStruct`` and static leaves).
        kwargs: keyword arguments, never differentiated.
        options: what the plan is asked for.
        argnums: the differentiated positional arguments, normalized (in order, none negative).
        constants: the search's constants a plan also depends on (the planner's upper-case
            class attributes, such as ``RETRY_MARGIN``): they join its key.
    """

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    options: PlanOptions
    argnums: tuple[int, ...]
    constants: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, fn: Callable[..., Any], args: tuple, kwargs: dict, options: PlanOptions,
           constants: Mapping[str, Any]) -> Call:
        """The call, its ``argnums`` normalized for ``args``.

        Raises:
            InvalidArgnumsError: ``options.argnums`` is out of range for ``args``.
        """
        return cls(fn, args, kwargs, options, normalize_argnums(options.argnums, len(args)), constants)

    @property
    def nums(self) -> int | tuple[int, ...]:
        """The differentiated arguments as ``jax.grad`` takes them."""
        return grad_argnums(self.argnums)

    @property
    def step(self) -> StepCall:
        """``fn``'s gradient step on the call, as XLA compiles it."""
        return StepCall(self.fn, self.args, self.kwargs, self.nums, self.has_aux)

    @property
    def has_aux(self) -> bool:
        return self.options.has_aux

    @property
    def budget(self) -> int:
        return self.options.budget_bytes

    @functools.cached_property
    def whole(self) -> TracedProgram:
        """``fn`` traced on the call with its scans whole (as written)."""
        return trace(self.fn, self.args, self.kwargs, self.argnums)

    def whole_as(self, traced: TracedProgram) -> TracedProgram:
        """``fn`` with its scans whole, given ``traced`` (it may have unrolled some): ``traced``
        itself where it unrolled none (kept as :attr:`whole`, unless traced before), else :attr:`whole`."""
        if traced.unrolled_scans:
            return self.whole
        self.__dict__.setdefault("whole", traced)  # a cache: the same program, traced once
        return traced

    @functools.cached_property
    def derivatives(self) -> str | None:
        """What the program's text leaves out of its gradient (:func:`remat_opt.cache._cache.derivative_text`)."""
        return derivative_text(self.whole, self.fn, self.args, self.kwargs, self.nums, self.has_aux)

    def key(self, budget: int | None) -> str:
        """The key of the plan at ``budget`` (:func:`remat_opt.cache._cache.plan_key`); ``None``: of what
        holds of the program at any budget (:mod:`remat_opt.cache._lowest`, :mod:`remat_opt.cache._front`)."""
        return plan_key(self.whole, budget, options_of(self.options, self.argnums, self.constants),
                        layout_of(self.args, self.kwargs, self.options.links), self.derivatives)
