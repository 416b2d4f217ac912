"""Exceptions raised by remat_opt.

Every error the library raises on purpose derives from :class:`RematOptError`, and
also from the built-in exception a caller would expect (``ValueError`` for a bad
value, ``TypeError`` for a bad type, ...), so both ``except RematOptError`` and
``except ValueError`` work.

Every message names the offending argument, shows the bad value and says what to
do instead. The exceptions keep their constructor arguments as attributes and
survive pickling (needed when plans are computed in worker processes).

Example:
    >>> from remat_opt._errors import InfeasibleBudgetError
    >>> err = InfeasibleBudgetError(1_000_000, 3_200_000)
    >>> isinstance(err, ValueError), err.min_budget_bytes
    (True, 3200000)
"""

from __future__ import annotations

import math
from typing import Any

from ._units import binary_bytes

__all__ = [
    "ClosedOverTracerError",
    "InfeasibleBudgetError",
    "InvalidArgnumsError",
    "InvalidArgnumsTypeError",
    "InvalidBudgetError",
    "InvalidBudgetTypeError",
    "InvalidLossError",
    "InvalidOptionError",
    "InvalidOptionTypeError",
    "NonDifferentiableArgumentError",
    "RematOptError",
    "UnsupportedProgramError",
]


def _describe_bytes(n: int, *, unit: str = " bytes") -> str:
    """Returns ``"1,000,000 bytes (976.56 KiB)"``-style text for messages."""
    return f"{n:,}{unit} ({binary_bytes(int(n))})"


REPR_LIMIT = 200
"""Characters of a rejected value shown in a message: a params pytree passed as ``fn`` once
made a 46 KB message."""


SMALL_ARRAY = 16
"""Arrays of at most this many elements are shown by value."""


class _Brief:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)`` for an error message: arrays of more than :data:`SMALL_ARRAY` elements
    as ``float32[256,256]``, the whole cut to ``limit`` characters (saying how long it was).

    Example:
        >>> import numpy as np
        >>> short_repr({"w": np.zeros((256, 256), np.float32)})
        "{'w': float32[256,256]}"
    """

    def brief(leaf: Any) -> Any:
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if isinstance(shape, tuple) and dtype is not None and not isinstance(leaf, type) \
                and math.prod(shape) > SMALL_ARRAY:
            return _Brief(f"{dtype}[{','.join(str(d) for d in shape)}]")
        return leaf

    try:
        import jax  # Deferred: this module is imported before jax is needed.

        text = repr(jax.tree_util.tree_map(brief, value))
    except Exception:  # noqa: BLE001 - a value whose pytree or repr fails is shown by type
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001
            text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def _with_detail(message: str, detail: str) -> str:
    return f"{message} {detail.strip()}" if detail and detail.strip() else message


class RematOptError(Exception):
    """Base class of the errors remat_opt raises on purpose."""


class InvalidBudgetError(RematOptError, ValueError):
    """A memory budget (or other byte count) has the right type but a bad value.

    Attributes:
        argument: Name of the argument that was rejected, e.g. ``"budget_bytes"``.
        value: The rejected value, as passed.
    """

    def __init__(self, message: str, *, argument: str, value: object) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value

    def __reduce__(self):  # noqa: D105 - keeps keyword-only arguments through pickle.
        return (_rebuild_with_kwargs, (type(self), self.args, self.__dict__))


class InvalidBudgetTypeError(RematOptError, TypeError):
    """A memory budget (or other byte count) was passed as an unsupported type.

    Attributes:
        argument: Name of the argument that was rejected, e.g. ``"budget_bytes"``.
        value: The rejected value, as passed.
    """

    def __init__(self, message: str, *, argument: str, value: object) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value

    def __reduce__(self):  # noqa: D105
        return (_rebuild_with_kwargs, (type(self), self.args, self.__dict__))


class _ArgumentError(RematOptError):
    """An argument of ``optimize`` or of a call was rejected; keeps which one and its value.

    Attributes:
        argument: Name of the rejected argument, e.g. ``"argnums"`` or ``"args[0]"``.
        value: The rejected value, as passed (a description for values not kept alive).
    """

    def __init__(self, message: str, *, argument: str, value: object) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value

    def __reduce__(self):  # noqa: D105
        return (_rebuild_with_kwargs, (type(self), self.args, self.__dict__))


class InvalidArgnumsError(_ArgumentError, ValueError):
    """``argnums`` names no positional argument, one out of range, or one twice."""


class InvalidArgnumsTypeError(_ArgumentError, TypeError):
    """``argnums`` is not an int or a sequence of ints."""


class InvalidOptionError(_ArgumentError, ValueError):
    """An option of ``optimize`` or ``optimize_step`` has the right type but a bad value
    (``max_attempts=0``, ``unroll_scans=-1``)."""


class InvalidOptionTypeError(_ArgumentError, TypeError):
    """An option of ``optimize`` or ``optimize_step``, or the function passed, has the wrong type
    (``fn`` not callable, ``cache=123``, ``has_aux="yes"``)."""


class NonDifferentiableArgumentError(_ArgumentError, TypeError):
    """A differentiated argument (one ``argnums`` names) holds nothing ``jax.grad`` can differentiate."""


class InvalidLossError(_ArgumentError, TypeError):
    """``fn`` returns something other than a real floating scalar loss (with ``has_aux``, as its first item)."""


class ClosedOverTracerError(_ArgumentError, TypeError):
    """``fn`` closes over a value traced by an enclosing ``jax.jit``, ``jax.grad``, ``jax.vmap``, ...

    A plan is kept across calls, so a function whose constants belong to one
    trace would carry them into the next; the value must be an argument.
    """


def _rebuild_with_kwargs(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class InfeasibleBudgetError(RematOptError, ValueError):
    """No checkpoint placement remat_opt tried brings the program's peak memory under the budget.

    The figure it names is one of two things, and the message says which:

    - the lowest peak XLA measured for any plan of this program in the search at this
      budget (``lower_bound=False``): the same for the same program, budget and options,
      whatever ran before in the process; a budget at or above it is planned;
    - the bytes every gradient step of the program holds, its arguments and outputs
      (``lower_bound=True``): the budget is under them, so it is refused before any search;
      the peak of a plan is higher (XLA's temporaries come on top).

    Args:
        budget_bytes: The budget the caller asked for.
        min_budget_bytes: The figure above.
        detail: Optional extra sentence(s) appended to the message, e.g. which
            plan measured the figure.
        schedule: The lowest-memory :class:`remat_opt.Schedule` found, if known.
        lower_bound: Whether ``min_budget_bytes`` is the arguments' and outputs' bytes.

    Attributes:
        budget_bytes: As passed.
        min_budget_bytes: As passed.
        detail: As passed.
        schedule: As passed.
        lower_bound: As passed.
    """

    def __init__(self, budget_bytes: int, min_budget_bytes: int, detail: str = "", schedule: Any = None,
                 lower_bound: bool = False) -> None:
        self.budget_bytes = budget_bytes
        self.min_budget_bytes = min_budget_bytes
        self.detail = detail
        self.schedule = schedule
        self.lower_bound = lower_bound
        budget = _describe_bytes(budget_bytes, unit="")
        if lower_bound:
            message = (
                f"budget_bytes={budget} is below what every gradient step of this program holds, whatever it "
                "recomputes: its parameters, inputs, gradients and loss outputs take "
                f"{_describe_bytes(min_budget_bytes)}, "
                "and XLA's temporaries come on top. Pass a larger budget; remat_opt.peak_bytes(fn, *args) "
                "gives the step's peak without remat."
            )
        else:
            message = (
                f"budget_bytes={budget} is below the lowest peak XLA measured for any plan remat_opt tried for "
                f"this program at this budget, {_describe_bytes(min_budget_bytes)}; "
                f"pass budget_bytes >= {min_budget_bytes}."
            )
        super().__init__(_with_detail(message, detail))

    def __reduce__(self):  # noqa: D105
        return (type(self), (self.budget_bytes, self.min_budget_bytes, self.detail, self.schedule, self.lower_bound))


class UnsupportedProgramError(RematOptError, NotImplementedError):
    """The program contains a primitive the planner cannot plan through.

    Args:
        primitive: Name of the JAX primitive, e.g. ``"while"``.
        source: Where the equation came from (``"file.py:12 (fn)"``), if known.
        hint: What the caller can do instead, e.g. "wrap the loop in jax.checkpoint".

    Attributes:
        primitive: As passed.
        source: As passed.
        hint: As passed.
    """

    def __init__(self, primitive: str, source: str | None, hint: str) -> None:
        self.primitive = primitive
        self.source = source
        self.hint = hint
        where = f" (at {source})" if source else ""
        super().__init__(
            f"remat_opt cannot plan through primitive {primitive!r}{where}. {hint.strip()}"
        )

    def __reduce__(self):  # noqa: D105
        return (type(self), (self.primitive, self.source, self.hint))
