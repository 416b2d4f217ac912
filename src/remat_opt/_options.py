"""The options of ``optimize``: each with its one default, checked in one place.

:class:`PlanOptions` holds every option :func:`remat_opt.optimize` takes, with the
default its signature shows (a test holds the two equal), and checks them when it is
made: a bad option is refused where it is given, with a typed error naming it, not at
the first call. :class:`remat_opt.OptimizedFunction` plans with one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax

from ._budget import parse_bytes
from ._errors import InvalidBudgetError, InvalidOptionError, InvalidOptionTypeError, short_repr
from ._inputs import check_argnums
from .memory._pipeline import ModelOptions
from .program._cost import CostModel, Interconnect
from .solve._solve import SolverOptions

OBJECTIVES = ("auto", "time", "flops")
"""What ``optimize`` may minimise under the budget."""


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """What a plan is asked for, besides the function: ``optimize``'s arguments (see
    :func:`remat_opt.optimize` for each), checked.

    ``budget_bytes`` is a number of bytes here; :func:`budget_of` reads the forms
    ``optimize`` takes (``"512MiB"``, ``"device"``). ``solver_options`` and
    ``interconnect`` keep ``None`` as given; :attr:`solver` and :attr:`links` are what
    planning uses.

    Raises:
        InvalidOptionTypeError: an option has the wrong type.
        InvalidOptionError: an option has a bad value (``max_attempts=0``).
        InvalidBudgetTypeError, InvalidBudgetError: ``budget_bytes`` is not a positive size.
        InvalidArgnumsTypeError, InvalidArgnumsError: ``argnums`` is not one or more indices.
    """

    budget_bytes: int
    argnums: int | Sequence[int] = 0
    solver_options: SolverOptions | None = None
    max_attempts: int = 4
    cost_model: CostModel | None = None
    has_aux: bool = False
    unroll_scans: int = 8
    compute_saved_once: bool = True
    xla_facts: bool = True
    cache: bool | str | os.PathLike = True
    interconnect: Interconnect | None = None
    in_shardings: Any = None
    objective: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget_bytes", parse_bytes(self.budget_bytes, argument="budget_bytes"))
        if not isinstance(self.objective, str) or self.objective not in OBJECTIVES:
            raise InvalidOptionError(f"objective must be one of {OBJECTIVES}; got {self.objective!r}.",
                                     argument="objective", value=self.objective)
        check_count("max_attempts", self.max_attempts, 1, " (the default is 4)")
        _check_type("solver_options", self.solver_options, SolverOptions)
        check_argnums(self.argnums)
        check_count("unroll_scans", self.unroll_scans, 0, " (0 keeps scans whole)")
        for flag in ("has_aux", "compute_saved_once", "xla_facts"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise InvalidOptionTypeError(f"{flag} must be a bool; got {short_repr(value)}. Pass True or False.",
                                             argument=flag, value=value)
        _check_type("interconnect", self.interconnect, Interconnect)
        if not isinstance(self.cache, (bool, str, os.PathLike)):
            raise InvalidOptionTypeError("cache must be True, False or a folder (str or os.PathLike); got "
                                         f"{short_repr(self.cache)}. "
                                         "Pass one of those.", argument="cache", value=self.cache)

    @property
    def solver(self) -> SolverOptions:
        """CP-SAT's settings: ``solver_options``, else the defaults."""
        return self.solver_options or SolverOptions()

    @property
    def links(self) -> Interconnect:
        """What a collective byte costs: ``interconnect``, else the default links."""
        return self.interconnect or Interconnect()

    @property
    def model_options(self) -> ModelOptions:
        """How the program planned is modelled (:func:`remat_opt.memory._pipeline.program_model`):
        scans unrolled up to ``unroll_scans``, a ``shard_map``'s body, one device's bytes on a
        mesh (collectives priced on :attr:`links`), XLA's facts as ``xla_facts`` says."""
        return ModelOptions(self.cost_model, self.unroll_scans, body=True, interconnect=self.links,
                            xla_facts=self.xla_facts)

    def minimises_time(self) -> bool:
        """Whether plans minimise the step time on the device (``objective``; ``"auto"``: off the CPU)."""
        if self.objective == "auto":
            return jax.default_backend() != "cpu"
        return self.objective == "time"


def budget_of(budget_bytes: Any) -> int:
    """``optimize``'s ``budget_bytes`` in bytes: a size (``4096``, ``"512MiB"``), or ``"device"``
    for the memory of the device (:func:`device_memory`).

    Raises:
        InvalidBudgetTypeError, InvalidBudgetError: not a positive size, or ``"device"`` on the CPU.
    """
    if isinstance(budget_bytes, str) and budget_bytes == "device":
        return device_memory()
    return parse_bytes(budget_bytes, argument="budget_bytes")


def device_memory() -> int:
    """The memory of the default device, as it reports it (``bytes_limit``).

    Raises:
        InvalidBudgetError: the device reports no memory limit (the CPU).
    """
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
        raise InvalidBudgetError(f"budget_bytes='device' needs a device that reports its memory (a TPU or GPU); "
                                 f"{device.platform} does not. Pass a size such as '8GiB'.",
                                 argument="budget_bytes", value="device")
    return int(stats["bytes_limit"])


def check_count(option: str, value: Any, minimum: int, note: str = "") -> None:
    """``value`` is an int (not a bool) of at least ``minimum``, 0 or 1; ``note`` follows the
    option's kind in the error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else "a non-negative int"
        raise InvalidOptionError(f"{option} must be {kind}{note}; got {short_repr(value)}. Pass {minimum} or more.",
                                 argument=option, value=value)


def _check_type(option: str, value: Any, kind: type) -> None:
    """``value`` is ``None`` or a ``kind`` (a class remat_opt exports)."""
    if value is not None and not isinstance(value, kind):
        raise InvalidOptionTypeError(f"{option} must be None or a remat_opt.{kind.__name__}; got "
                                     f"{type(value).__name__}. Pass remat_opt.{kind.__name__}(...).",
                                     argument=option, value=value)
