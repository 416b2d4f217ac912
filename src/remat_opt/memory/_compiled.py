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

import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from ._compiles import compiled_figures
from ._measure import memory_of

_EQN = re.compile(r"remat_opt_eqn(\d+)")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_ARRAY = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")
_PASS_THROUGH = frozenset({"bitcast", "tuple", "parameter", "constant"})


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
    """

    peak_bytes: int
    held: tuple[HeldBuffer, ...]
    backend: str
    deferred: tuple[DeferredSum, ...] = ()


@dataclass(frozen=True)
class _Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    op_name: str
    calls: str = ""


_CALLS = re.compile(r"calls=%([\w.\-]+)")
_INDEX = re.compile(r"index=(\d+)")


def _array_bytes(shape: str) -> int:
    found = _ARRAY.match(shape)
    if not found:
        return 0
    dims = [int(d) for d in found[2].split(",") if d]
    bits = int(re.sub(r"\D", "", found[1]) or 8)  # pred (and token) have no width: a byte
    return int(np.prod(dims, dtype=np.int64)) * max(1, bits // 8)


def parse_module(hlo_text: str) -> tuple[str, dict[str, list[_Instruction]]]:
    """The module's computations (name -> instructions, the root last) and its entry's name."""
    computations: dict[str, list[_Instruction]] = {}
    entry, current, root = "", None, None
    for line in hlo_text.splitlines():
        header = re.match(r"^(ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if header:
            current, root = header[2], None
            computations[current] = []
            entry = current if header[1] else entry
            continue
        if line.startswith("}"):
            if current is not None and root is not None:  # the root goes last
                body = computations[current]
                body.append(body.pop(root))
            current = None
            continue
        found = _INSTRUCTION.match(line) if current is not None else None
        if not found:
            continue
        name, shape, opcode, rest = found.groups()
        args = rest.split("), ")[0] if "), " in rest else rest.rsplit(")", 1)[0]
        op_name, calls = _OP_NAME.search(rest), _CALLS.search(rest)
        if opcode == "get-tuple-element":
            index = _INDEX.search(rest)
            opcode = f"get-tuple-element.{index[1] if index else 0}"
        if line.lstrip().startswith("ROOT "):
            root = len(computations[current])
        computations[current].append(_Instruction(name, shape, opcode, tuple(_OPERAND.findall(args)),
                                                  op_name[1] if op_name else "", calls[1] if calls else ""))
    return entry, computations


def _origin(instruction: _Instruction, computations: dict[str, list[_Instruction]], index: int | None) -> str:
    """The ``op_name`` of what a (fusion) instruction computes: its fused root's, through views."""
    body = computations.get(instruction.calls) if instruction.opcode == "fusion" else None
    if not body:
        return instruction.op_name
    by_name = {i.name: i for i in body}
    node = body[-1]
    for _ in range(len(body)):
        if node.opcode == "tuple" and index is not None and index < len(node.operands):
            node, index = by_name.get(node.operands[index], node), None
        elif node.opcode in ("bitcast", "copy") and node.operands and node.operands[0] in by_name:
            node = by_name[node.operands[0]]
        else:
            break
    return node.op_name or instruction.op_name


def _eqn_of(instruction: _Instruction, by_name: dict[str, _Instruction],
            computations: dict[str, list[_Instruction]], index: int | None = None) -> tuple[int, str] | None:
    """The primal equation and primitive an entry instruction computes: from its
    (fused root's) ``op_name``; for a copy XLA added without one (a relayout),
    from what it copies; ``-1`` for a copy of a program input."""
    steps = 0
    for _ in range(64):
        op_name = _origin(instruction, computations, index)
        found = _EQN.findall(op_name)
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
        if i.name not in read_by_backward or i.opcode in _PASS_THROUGH:
            continue
        index = int(i.opcode.rsplit(".", 1)[1]) if i.opcode.startswith("get-tuple-element.") else None
        source = by_name.get(i.operands[0], i) if index is not None and i.operands else i
        origin = _eqn_of(source, by_name, computations, index)
        if origin is not None:
            held.append(HeldBuffer(i.name, origin[0], origin[1], _array_bytes(i.shape)))
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
        if i is None or not _origin(i, computations, None).endswith("add_any"):
            continue
        size = _array_bytes(i.shape)
        eqns = set()
        partials = 0
        for operand in dict.fromkeys(i.operands):
            o = by_name.get(operand)
            if o is None or _array_bytes(o.shape) != size:
                continue
            origin = _eqn_of(o, by_name, computations)
            if origin is not None and origin[0] >= 0:
                partials += 1
                eqns.add(origin[0])
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
        and the outputs it sums from partials held until the end.
    """
    def read(lowered: Any) -> CompiledProgram:
        compiled, hlo = _dumped(lowered, "after_optimizations.txt")
        text = hlo or compiled.as_text()
        return CompiledProgram(memory_of(compiled), held_buffers(text), jax.default_backend(), deferred_sums(text))

    return compiled_figures(jax.jit(step).lower(*args, **kwargs), "compiled program", read)


@contextmanager
def _compiled_afresh() -> Iterator[None]:
    """JAX's persistent compilation cache off, for one compile: an executable
    loaded from it was not compiled in this process, so XLA dumps nothing for
    it (``xla_dump_to`` is not part of the cache key). The cache is reset
    before and after, as ``reset_cache`` documents; not thread-safe."""
    if not jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
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
    return _dumped(jax.jit(step).lower(*args, **kwargs), suffix)


def _dumped(lowered: Any, suffix: str) -> tuple[Any, str | None]:
    """``lowered`` compiled with XLA's dump on, and the dumped file ending with ``suffix``."""
    with tempfile.TemporaryDirectory(prefix="remat_opt_xla_") as folder, _compiled_afresh():
        compiled = lowered.compile(compiler_options={"xla_dump_to": folder})
        dumps = sorted(Path(folder).glob(f"*{suffix}"))
        return compiled, dumps[-1].read_text() if dumps else None
