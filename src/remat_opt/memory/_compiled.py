"""What XLA made of the program: the buffers its forward leaves for the backward.

Which values get a buffer of their own is XLA's decision (fusion, CSE, layout),
and it differs between backends and releases. Instead of a table per
primitive, the model reads it off the compiled program at hand: XLA writes the
optimized HLO, with each instruction's ``op_name`` metadata, when it is asked
to dump (``compiler_options={"xla_dump_to": dir}``, on every backend). The
program is compiled as :mod:`remat_opt.program._names` evaluates it, so every
instruction's ``op_name`` carries the primal equation it was lowered from
(``jvp(remat_opt_eqn12)`` in the forward, ``transpose(jvp(remat_opt_eqn12))``
in the backward).

A forward instruction whose output a backward instruction reads (directly, or
through the bitcasts, copies and tuple projections XLA puts between them) is a
buffer held from the forward into the backward: a residual XLA keeps, or the
source it recomputes fused residuals from. :func:`read_compiled` returns
those, each with its size and equation.

A gradient whose partial cotangents (one per reader of a weight shared by
several equations: a recurrent cell's weights, unrolled) XLA adds up in one
n-ary sum at the end of the step, instead of into an accumulator as each is
computed, holds every partial until then. :func:`deferred_sums` reads those
sums off the compiled program: XLA:CPU fuses JAX's chain of ``add_any`` into
one loop fusion whose operands are all the partials.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from ._compiles import PEAK_FIGURES_ONLY, compile_for_figures, compiled_figures
from ._hlo import EQN, PASS_THROUGH, Instruction, array_bytes, origin, parse_module
from ._measure import memory_of
from ._scratch import transpose_scratch


@dataclass(frozen=True)
class HeldBuffer:
    """A forward buffer a backward instruction reads.

    Attributes:
        instruction: the HLO instruction that writes it.
        eqn: the primal equation it was lowered from; ``-1`` for a copy of a
            program input (a weight in the layout its backward reads).
        primitive: the JAX primitive its ``op_name`` ends with.
        bytes: its size.
    """

    instruction: str
    eqn: int
    primitive: str
    bytes: int


@dataclass(frozen=True)
class DeferredSum:
    """A step output XLA computes as one sum of several partial cotangents, all
    live until it runs.

    Attributes:
        instruction: the HLO instruction that adds them.
        bytes: the size of the output, and of each partial.
        eqns: the primal equations the partials were lowered from (the
            transposes of the equations that read one value).
    """

    instruction: str
    bytes: int
    eqns: frozenset[int]


@dataclass(frozen=True)
class CompiledProgram:
    """Facts XLA states about one compiled gradient step.

    Attributes:
        peak_bytes: argument + output + temp − alias bytes
            (:func:`remat_opt.memory.peak_bytes`'s figure).
        held: the forward buffers the backward reads (:class:`HeldBuffer`).
        backend: the platform it was compiled for.
        deferred: the step's outputs XLA sums from three or more partials held
            until the sum (:class:`DeferredSum`).
        scratch: ``(equation, backward, forward, held)``: the most scratch XLA
            holds at once while it transposes that equation, in the backward
            proper and in the part that reads forward values only, and of
            that part what the backward proper reads
            (:func:`remat_opt.memory._scratch.transpose_scratch`).
    """

    peak_bytes: int
    held: tuple[HeldBuffer, ...]
    backend: str
    deferred: tuple[DeferredSum, ...] = ()
    scratch: tuple[tuple[int, int, int, int], ...] = ()


def _eqn_of(instruction: Instruction, by_name: dict[str, Instruction],
            computations: dict[str, list[Instruction]], index: int | None = None) -> tuple[int, str] | None:
    """The primal equation and primitive an entry instruction computes: from its
    (fused root's) ``op_name``; for a copy XLA added without one (a relayout),
    from what it copies; ``-1`` for a copy of a program input."""
    steps = 0
    for _ in range(64):
        op_name = origin(instruction, computations, index)
        found = EQN.findall(op_name)
        if found:
            return int(found[-1]), op_name.rsplit("/", 1)[-1]
        if instruction.opcode == "parameter" and steps:
            return -1, "input"  # a copy of a program input (a transposed weight)
        if op_name or not instruction.operands or instruction.operands[0] not in by_name:
            return None  # a parameter or constant (live anyway), or not from the program
        instruction, index, steps = by_name[instruction.operands[0]], None, steps + 1
    return None


def held_buffers(hlo_text: str) -> tuple[HeldBuffer, ...]:
    """The buffers XLA carries from the forward into the backward.

    An entry instruction belongs to the backward when it was lowered from the
    transposed program, or reads a value that does (a copy or convolution
    XLA made without metadata, fed by a cotangent). A buffer the forward
    writes and a backward instruction reads, directly or through views, is
    held across. Each is attributed to the equation it was lowered from; a
    copy without metadata (a relayout), to the value it copies.
    """
    entry, computations = parse_module(hlo_text)
    instructions = computations.get(entry, [])
    by_name = {i.name: i for i in instructions}
    backward: set[str] = set()
    for i in instructions:  # schedule order: operands come first
        if "transpose(" in i.op_name or any(o in backward for o in i.operands):
            backward.add(i.name)

    def owners(name: str) -> list[str]:  # the buffers a read of ``name`` keeps alive
        i = by_name.get(name)
        if i is None or i.opcode not in ("bitcast", "tuple"):
            return [name]
        return [o for operand in i.operands for o in owners(operand)]

    read_by_backward: set[str] = set()
    for reader in instructions:
        if reader.name in backward and reader.opcode not in ("bitcast", "tuple"):
            for operand in reader.operands:
                read_by_backward.update(o for o in owners(operand) if o not in backward)
    held = []
    for i in instructions:
        if i.name not in read_by_backward or i.opcode in PASS_THROUGH:
            continue
        index = int(i.opcode.rsplit(".", 1)[1]) if i.opcode.startswith("get-tuple-element.") else None
        source = by_name.get(i.operands[0], i) if index is not None and i.operands else i
        found = _eqn_of(source, by_name, computations, index)
        if found is not None:
            held.append(HeldBuffer(i.name, found[0], found[1], array_bytes(i.shape)))
    return tuple(sorted(held, key=lambda b: (b.eqn, b.instruction)))


def deferred_sums(hlo_text: str) -> tuple[DeferredSum, ...]:
    """The step's outputs that XLA adds up from three or more partials at once.

    An output of the entry computation (through bitcasts and copies) lowered
    from JAX's ``add_any`` (its own ``op_name``, or its fused root's) whose
    instruction reads three or more operands of its own size, each lowered
    from an equation of the program, is such a sum: every operand is a
    partial written earlier and held until the sum. (XLA:CPU fuses JAX's
    chain of ``add_any`` into one fusion whose operands are the partials; a
    backend that accumulates as it goes shows a chain of two-operand adds,
    and no such output.)
    """
    entry, computations = parse_module(hlo_text)
    instructions = computations.get(entry, [])
    if not instructions:
        return ()
    by_name = {i.name: i for i in instructions}
    root = instructions[-1]
    outputs = list(root.operands) if root.opcode == "tuple" else [root.name]
    out: list[DeferredSum] = []
    for name in outputs:
        i = by_name.get(name)
        while i is not None and i.opcode in ("bitcast", "copy") and i.operands and i.operands[0] in by_name:
            i = by_name[i.operands[0]]
        if i is None or not origin(i, computations, None).endswith("add_any"):
            continue
        size = array_bytes(i.shape)
        eqns = set()
        partials = 0
        for operand in dict.fromkeys(i.operands):
            o = by_name.get(operand)
            if o is None or array_bytes(o.shape) != size:
                continue
            found = _eqn_of(o, by_name, computations)
            if found is not None and found[0] >= 0:
                partials += 1
                eqns.add(found[0])
        if partials >= 3:
            out.append(DeferredSum(i.name, size, frozenset(eqns)))
    return tuple(out)


def read_compiled(step: Callable[..., Any], *args: Any, **kwargs: Any) -> CompiledProgram:
    """Compiles ``jax.jit(step)`` on these (abstract) arguments and reads what XLA made of it.

    Args:
        step: a gradient step, as :func:`remat_opt.memory._measure.gradient_step` makes it.
        *args: its arguments (``jax.ShapeDtypeStruct`` leaves are fine).
        **kwargs: its keyword arguments.

    Returns:
        XLA's peak, the buffers it holds from the forward into the backward,
        the outputs it sums from partials held until the end, and the
        scratch it holds while it transposes each equation.
    """
    def read(lowered: Any) -> CompiledProgram:
        compiled, (hlo, live_range, assignment) = _dumped(
            lowered, "after_optimizations.txt", "after_optimizations-live-range.txt",
            "after_optimizations-buffer-assignment.txt")
        text = hlo or compiled.as_text()
        scratch = transpose_scratch(text, live_range, assignment) if live_range and assignment else {}
        return CompiledProgram(memory_of(compiled), held_buffers(text), jax.default_backend(), deferred_sums(text),
                               tuple((eqn, *figures) for eqn, figures in sorted(scratch.items())))

    # Compiled for its figures, as a candidate is: a candidate that lowers to this very
    # module (a schedule that changes nothing) is measured without a compile of its own.
    return compiled_figures(jax.jit(step).lower(*args, **kwargs), "compiled program", read,
                            also={PEAK_FIGURES_ONLY: lambda program: program.peak_bytes})


@contextmanager
def _compiled_afresh() -> Iterator[None]:
    """JAX's persistent compilation cache off, for one compile: an executable
    loaded from it was not compiled in this process, so XLA dumps nothing for
    it (``xla_dump_to`` is not part of the cache key). The cache is reset
    before and after, as ``reset_cache`` documents; not thread-safe."""
    settings = jax.config.values  # public; the flag attributes are untyped on jax 0.10
    if not settings.get("jax_compilation_cache_dir") or not settings.get("jax_enable_compilation_cache"):
        yield
        return
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()


def compile_dumped(step: Callable[..., Any], suffix: str, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """``jax.jit(step)`` compiled here, with XLA's dump on, and the text of the
    dumped file whose name ends with ``suffix`` (``None`` if XLA wrote none)."""
    compiled, (text,) = _dumped(jax.jit(step).lower(*args, **kwargs), suffix)
    return compiled, text


def _dumped(lowered: Any, *suffixes: str) -> tuple[Any, list[str | None]]:
    """``lowered`` compiled with XLA's dump on, and per suffix the text of the
    dumped file whose name ends with it (``None`` if XLA wrote none)."""
    with tempfile.TemporaryDirectory(prefix="remat_opt_xla_") as folder, _compiled_afresh():
        compiled = compile_for_figures(lowered, xla_dump_to=folder)
        texts = []
        for suffix in suffixes:
            dumps = sorted(Path(folder).glob(f"*{suffix}"))
            texts.append(dumps[-1].read_text() if dumps else None)
        return compiled, texts
