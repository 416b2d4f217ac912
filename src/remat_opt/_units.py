"""A byte count as text, in binary units: the floor under :mod:`remat_opt._errors` and
:mod:`remat_opt._budget`.

Both need it (an error message states the budget it rejects; ``format_bytes`` checks its
argument and raises one of those errors), so it lives below both and the imports run one way:
``_budget`` -> ``_errors`` -> ``_units``.

Example:
    >>> binary_bytes(512), binary_bytes(3 * 2**29), binary_bytes(-2048)
    ('512 B', '1.50 GiB', '-2.00 KiB')
"""

from __future__ import annotations

_BINARY_STEPS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def binary_bytes(count: int) -> str:
    """``count`` bytes with two decimals in the largest binary unit that keeps the number at least
    1 (exactly, in ``B``, below 1 KiB); unchecked: :func:`remat_opt.format_bytes` checks the type."""
    sign, magnitude = ("-" if count < 0 else ""), abs(count)
    if magnitude < 1024:
        return f"{sign}{magnitude} B"
    value = float(magnitude)
    for unit in _BINARY_STEPS:
        value /= 1024
        # Move up a unit when rounding would print "1024.00" of this one.
        if round(value, 2) < 1024 or unit == _BINARY_STEPS[-1]:
            return f"{sign}{value:.2f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
