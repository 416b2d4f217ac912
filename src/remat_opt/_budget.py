"""Parsing and formatting of byte counts such as memory budgets.

``parse_bytes`` turns what a user may reasonably type (``8 * 2**30``, ``"512MiB"``,
``"2 GB"``, ``"1_000_000"``) into a positive ``int`` of bytes; ``format_bytes`` does the
reverse for messages and reports, always in binary units.

Example:
    >>> parse_bytes("1.5 GiB")
    1610612736
    >>> format_bytes(1610612736)
    '1.50 GiB'
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

import numpy as np

from remat_opt._errors import InvalidBudgetError, InvalidBudgetTypeError, short_repr
from remat_opt._units import binary_bytes

__all__ = ["format_bytes", "parse_bytes"]

# Unit spellings are matched case-insensitively, so "kb", "KB" and "kB" are all 1000
# bytes and "b" means bytes (not bits): nobody states a memory budget in bits.
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

_NUMBER_RE = re.compile(
    r"""^\s*
    (?P<sign>[+-])?
    (?P<number>(?:\d+(?:[_,]\d+)*(?:\.(?:\d+(?:_\d+)*)?)?|\.\d+(?:_\d+)*)(?:[eE][+-]?\d+)?)
    \s*
    (?P<unit>[A-Za-z]*)
    \s*$""",
    re.VERBOSE,
)

_EXAMPLE = "536870912 or '512MiB'"
_VALID_UNITS = "B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"


def _value_error(argument: str, value: object, problem: str) -> InvalidBudgetError:
    return InvalidBudgetError(
        f"{argument} {problem}; got {short_repr(value)}. Pass a positive byte count such as {_EXAMPLE}.",
        argument=argument,
        value=value,
    )


def parse_bytes(value: object, *, argument: str = "budget_bytes") -> int:
    """Converts a byte count given as a number or a string with units to an ``int``.

    Accepted forms:

    * a positive ``int`` or numpy integer: ``4096``;
    * a finite, positive, integral float: ``8 * 2**30 * 1.0`` (``1.5`` is rejected,
      since a fraction of a byte is almost certainly a mistake);
    * a string: a number, optional whitespace and an optional unit. Decimal units are
      ``kB``/``KB`` (1000), ``MB``, ``GB``, ``TB``; binary units are ``KiB`` (1024),
      ``MiB``, ``GiB``, ``TiB``; ``B``/``bytes`` or no unit mean bytes. Unit letters are
      case-insensitive, so a lowercase ``b`` also means bytes, never bits. Digits may
      be grouped with ``_`` or ``,`` (``"1_000_000"``, ``"1,000,000"``), and the number
      may have a fraction or an exponent (``"1.5 GiB"``, ``"1e9"``). With a unit larger
      than a byte the result is rounded down to whole bytes; a plain byte count must
      be whole. Bare ``K``/``M``/``G`` are rejected as ambiguous.

    Args:
        value: The byte count to parse.
        argument: Name of the argument being parsed, used in error messages.

    Returns:
        The number of bytes, always ``> 0``.

    Raises:
        InvalidBudgetTypeError: (a ``TypeError``) if ``value`` is a ``bool`` or of a type
            other than int, float or str.
        InvalidBudgetError: (a ``ValueError``) if the value is zero, negative, NaN,
            infinite, fractional bytes, unparsable, or has an unknown unit.

    Example:
        >>> parse_bytes("512MiB"), parse_bytes("2GB"), parse_bytes(4096)
        (536870912, 2000000000, 4096)
    """
    if isinstance(value, bool):
        raise InvalidBudgetTypeError(
            f"{argument} must be an int or a string such as '512MiB'; got {short_repr(value)} (bool).",
            argument=argument,
            value=value,
        )
    if isinstance(value, numbers.Integral):
        result = int(value)
        if result <= 0:
            raise _value_error(argument, value, "must be positive")
        return result
    if isinstance(value, float | np.floating):
        return _parse_float(float(value), value, argument)
    if isinstance(value, str):
        return _parse_string(value, argument)
    raise InvalidBudgetTypeError(
        f"{argument} must be an int or a string such as '512MiB'; "
        f"got {short_repr(value)} ({type(value).__name__}).",
        argument=argument,
        value=value,
    )


def _parse_float(number: float, original: object, argument: str) -> int:
    if math.isnan(number) or math.isinf(number):
        raise _value_error(argument, original, "must be a finite number of bytes")
    if number <= 0:
        raise _value_error(argument, original, "must be positive")
    if not number.is_integer():
        raise _value_error(argument, original, "must be a whole number of bytes")
    return int(number)


def _parse_string(text: str, argument: str) -> int:
    match = _NUMBER_RE.match(text)
    if match is None:
        raise InvalidBudgetError(
            f"{argument} could not be parsed as a byte count; got {text!r}. Write a number "
            f"with an optional unit, such as '512MiB', '2 GB' or '4096'.",
            argument=argument,
            value=text,
        )
    unit = match["unit"]
    multiplier = _UNITS.get(unit.lower())
    if multiplier is None:
        raise InvalidBudgetError(
            f"{argument} has an unknown unit {unit!r}; got {text!r}. Use one of "
            f"{_VALID_UNITS}, e.g. '512MiB'.",
            argument=argument,
            value=text,
        )
    digits = match["number"].replace("_", "").replace(",", "")
    try:
        number = Decimal(digits)
    except InvalidOperation:  # pragma: no cover - the regex only admits valid numerals.
        raise _value_error(argument, text, "could not be parsed as a byte count") from None
    if match["sign"] == "-":
        number = -number
    if number <= 0:
        raise _value_error(argument, text, "must be positive")
    total = number * multiplier
    if multiplier == 1 and total != total.to_integral_value():
        raise _value_error(argument, text, "must be a whole number of bytes")
    result = int(total.to_integral_value(rounding=ROUND_FLOOR))
    if result <= 0:
        raise _value_error(argument, text, "must be at least 1 byte once rounded down")
    return result


def format_bytes(n: int) -> str:
    """Formats a byte count for humans, in binary units with two decimals.

    Counts below 1 KiB are shown exactly (``"512 B"``); larger ones use the largest
    binary unit that keeps the number at least 1 (``"4.00 MiB"``, ``"1.50 GiB"``).

    Args:
        n: A number of bytes; negative counts are formatted with a leading ``-``.

    Returns:
        The formatted count.

    Raises:
        InvalidBudgetTypeError: if ``n`` is not an integer (``bool`` included).

    Example:
        >>> format_bytes(512), format_bytes(4 * 2**20), format_bytes(3 * 2**29)
        ('512 B', '4.00 MiB', '1.50 GiB')
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise InvalidBudgetTypeError(
            f"n must be an int number of bytes; got {short_repr(n)} ({type(n).__name__}).",
            argument="n",
            value=n,
        )
    return binary_bytes(int(n))
