"""Fragmentation at XLA's peak: the bytes live there against the bytes XLA allocated.

XLA's buffer assignment packs buffers whose live ranges do not overlap into
shared allocations, but not perfectly: an allocation is as large as the
largest set of buffers it ever holds, and buffers are placed at offsets that
leave holes. What :func:`remat_opt.peak_bytes` reports (argument + output +
temp − alias) is the allocated figure; the values live at the busiest moment
of the program add up to less. Checkpointing lowers the second figure; the
gap between them is what no checkpoint placement wins back, and worth
knowing before lowering a budget further.

The live figure is XLA's own: asked to dump (``compiler_options={"xla_dump_to":
dir}``, as :func:`remat_opt.memory._compiled.read_compiled` does), XLA writes a
``*-live-range.txt`` whose ``Live ranges at N (peak):`` section lists each
buffer live at its peak instruction with its bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from .._budget import format_bytes
from ._compiled import compile_dumped
from ._measure import abstract, gradient_step, memory_of

_PEAK = re.compile(r"^\s*Live ranges at (\d+) \(peak\):\s*$")
_BUFFER = re.compile(r"^\s*(\S+): (\d+) bytes \(cumulative: (\d+) bytes\)\s*$")


@dataclass(frozen=True)
class Fragmentation:
    """The bytes live at XLA's peak against the bytes XLA allocated for the program.

    Attributes:
        live_bytes: the sum of the buffers live at XLA's peak instruction
            (its live-range dump).
        allocated_bytes: argument + output + temp − alias bytes
            (``memory_analysis()``, :func:`remat_opt.peak_bytes`'s figure).
        buffers: the buffers live at the peak, ``(name, bytes)``, largest first,
            as XLA lists them (``name{index}``, the HLO value's instruction).
    """

    live_bytes: int
    allocated_bytes: int
    buffers: tuple[tuple[str, int], ...] = ()

    @property
    def gap_bytes(self) -> int:
        """Bytes allocated beyond those live at the peak (fragmentation and padding)."""
        return self.allocated_bytes - self.live_bytes

    def __str__(self) -> str:
        share = self.gap_bytes / self.allocated_bytes if self.allocated_bytes else 0.0
        return (f"at XLA's peak {format_bytes(self.live_bytes)} live of {format_bytes(self.allocated_bytes)} "
                f"allocated: {format_bytes(self.gap_bytes)} ({share:.1%}) no checkpoint placement wins back")


def live_at_peak(live_range_text: str) -> tuple[tuple[str, int], ...] | None:
    """The buffers of a ``*-live-range.txt`` dump's ``Live ranges at N (peak):``
    section, ``(name, bytes)``; ``None`` when the text has no such section."""
    lines = iter(live_range_text.splitlines())
    for line in lines:
        if _PEAK.match(line):
            break
    else:
        return None
    buffers = []
    for line in lines:
        found = _BUFFER.match(line)
        if not found:
            break
        buffers.append((found[1], int(found[2])))
    return tuple(buffers)


def read_fragmentation(step: Callable[..., Any], *args: Any, **kwargs: Any) -> Fragmentation | None:
    """Compiles ``jax.jit(step)`` on these (abstract) arguments and reads its
    live bytes at the peak beside its allocated bytes.

    Returns:
        The two figures; ``None`` when XLA wrote no live-range dump with a
        peak (a backend or release that does not).
    """
    compiled, dump = compile_dumped(step, "-live-range.txt", *args, **kwargs)
    buffers = live_at_peak(dump) if dump is not None else None
    if buffers is None:
        return None
    return Fragmentation(sum(b for _, b in buffers), memory_of(compiled), buffers)


def fragmentation(
    fn: Callable[..., Any], *args: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False, **kwargs: Any
) -> Fragmentation:
    """The bytes live at XLA's peak for one gradient step of ``fn``, against the
    bytes XLA allocates for it (:func:`remat_opt.peak_bytes`).

    Pass an optimized function (``remat_opt.optimize(loss, ...)``) to see its
    plan's step; the difference is what lowering the budget cannot remove.
    This compiles the step once more, bypassing JAX's persistent compilation
    cache (a cached executable comes with no dump).

    Args:
        fn: a function returning a scalar (a plain loss or an optimized one).
        *args: positional arguments (arrays, pytrees, or ``jax.ShapeDtypeStruct``).
        argnums: the positional arguments differentiated, as in ``jax.grad``.
        has_aux: ``fn`` returns ``(loss, aux)``, as in ``jax.grad``.
        **kwargs: keyword arguments, not differentiated.

    Returns:
        A :class:`Fragmentation`: ``live_bytes`` <= ``allocated_bytes``.

    Raises:
        RuntimeError: XLA wrote no live-range dump with a peak on this backend.

    Example:
        >>> import jax.numpy as jnp, remat_opt
        >>> f = remat_opt.fragmentation(lambda w: jnp.sum(jnp.tanh(w)), jnp.ones(1024))
        >>> f.live_bytes <= f.allocated_bytes
        True
    """
    step, args, kwargs = gradient_step(fn, args, kwargs, argnums, has_aux)
    found = read_fragmentation(step, *abstract(args), **abstract(kwargs))
    if found is None:
        raise RuntimeError(f"XLA ({jax.default_backend()}, jax {jax.__version__}) wrote no live-range dump "
                           "with a peak for this program; the live bytes at its peak are not available.")
    return found
