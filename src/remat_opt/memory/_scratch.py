"""What XLA holds while it transposes one equation, beyond the cotangents in flight.

The model's rule for a unit's backward is one cotangent in flight (XLA writes
most cotangents in place of a dead operand). Some transposes need buffers of
their own that no value of the program stands for: max pooling's backward on
XLA:CPU builds index tensors of the padded input and a variadic reduce-window
(four 32-bit index buffers and the pooled values beside the window's
maximum); a convolution in NCHW transposes through an NHWC copy. XLA's dump of
the plain program says how much, per equation:

* ``*after_optimizations.txt``: each instruction's ``op_name``; those lowered
  from ``transpose(jvp(remat_opt_eqnN))`` are equation ``N``'s backward, and an
  instruction without one (an ``iota`` XLA expanded) belongs to the equation
  whose backward reads it;
* ``*live-range.txt``: when each value is live, in schedule order;
* ``*buffer-assignment.txt``: each value's allocation slice, so that a value
  written in place of another counts once.

A value that equation ``N``'s transpose writes (or that XLA adds without an
``op_name`` from no forward value), and that only ``N``'s transpose reads, is
scratch. Its figure has two parts (:func:`transpose_scratch`): what reads a
cotangent another equation handed on, the most of it live at once; and what
reads forward values only, all of it. The cotangents it hands on, the
gradients, and the forward values it reads (relayout copies included) are
left to the model.
"""

from __future__ import annotations

import re
from collections import defaultdict

from ._hlo import EQN, Instruction, origin, parse_module

_VALUE = re.compile(r"value: <\d+ ([\w.\-]+)(\{[\d,]*\})? @\S*> \(size=(\d+),offset=(\d+)\)")
_ALLOCATION = re.compile(r"^allocation (\d+):")
_RANGE = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\}):(\d+)-(\d+)$", re.M)


def _slices(assignment: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Per value (instruction, tuple index): its allocation, offset and size."""
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    allocation = -1
    for line in assignment.splitlines():
        found = _ALLOCATION.match(line)
        if found:
            allocation = int(found[1])
            continue
        found = _VALUE.search(line)
        if found:
            out[(found[1], found[2] or "{}")] = (allocation, int(found[4]), int(found[3]))
    return out


def _owners(instructions: list[Instruction], computations: dict, readers: dict[str, set[str]]) -> dict[str, int]:
    """The equation whose backward each entry instruction belongs to: its own
    (fused root's) ``op_name``, or for one without, the one equation whose
    backward reads it."""
    owner: dict[str, int] = {}
    unnamed: list[Instruction] = []
    for i in instructions:
        op_name = origin(i, computations, None)
        found = EQN.findall(op_name)
        if "transpose(" in op_name and found:
            owner[i.name] = int(found[-1])
        elif not op_name and i.opcode not in ("parameter", "constant"):
            unnamed.append(i)
    for i in reversed(unnamed):  # readers come later in the schedule: settle them first
        eqns = {owner.get(r, -1) for r in readers[i.name]}
        if len(eqns) == 1 and -1 not in eqns:
            owner[i.name] = eqns.pop()
    return owner


def _readers(instructions: list[Instruction]) -> dict[str, set[str]]:
    """Per instruction, the instructions that read it, through bitcasts."""
    by_name = {i.name: i for i in instructions}
    readers: dict[str, set[str]] = defaultdict(set)
    for i in reversed(instructions):
        for o in i.operands:
            readers[o] |= readers[i.name] if i.opcode == "bitcast" else {i.name}
    for i in instructions:  # a bitcast's readers were settled after it was read: settle again
        if i.opcode == "bitcast" and i.operands and i.operands[0] in by_name:
            readers[i.operands[0]] |= readers[i.name]
    return readers


def _handed_in(instructions: list[Instruction], owner: dict[str, int]) -> set[str]:
    """The instructions that read, directly or not, a cotangent another
    equation's transpose handed on: the backward proper. (The rest of an
    equation's transpose reads forward values only, and XLA may run it in the
    forward, as it does max pooling's index search.)"""
    out: set[str] = set()
    for i in instructions:  # schedule order: operands come first
        mine = owner.get(i.name)
        if any(o in out or o in owner and owner[o] != mine for o in i.operands):
            out.add(i.name)
    return out


def _scratch_values(instructions: list[Instruction], owner: dict[str, int], computations: dict,
                    readers: dict[str, set[str]]) -> dict[str, tuple[int, bool]]:
    """The values that are scratch of one equation's transpose, each with its
    equation and whether it reads a cotangent handed in (:func:`_handed_in`).

    Scratch: written by the equation's transpose (or added by XLA without an
    ``op_name``, from no forward value), and read by that transpose alone,
    never by an instruction whose value the step returns nor by JAX's sum of
    partial cotangents (``add_any``): the model counts gradients and partials.
    """
    by_name = {i.name: i for i in instructions}
    handed_in = _handed_in(instructions, owner)
    transposed = {i.name for i in instructions if "transpose(" in i.op_name}
    root = instructions[-1] if instructions else None
    outputs = set(root.operands if root is not None and root.opcode == "tuple" else [])
    out = {}
    for i in instructions:
        eqn, read_by = owner.get(i.name), readers[i.name]
        if eqn is None or i.opcode in ("bitcast", "tuple") or not read_by or read_by & outputs:
            continue
        if i.op_name and i.name not in transposed or not i.op_name and i.name not in handed_in and any(
                o not in transposed and by_name[o].opcode != "constant" for o in i.operands if o in by_name):
            continue  # a forward value, or a copy XLA made of one (a relayout the model counts)
        if any(origin(by_name[r], computations, None).endswith("add_any") for r in read_by):
            continue
        if all(owner.get(r) == eqn for r in read_by):
            out[i.name] = (eqn, i.name in handed_in)
    return out


def transpose_scratch(hlo: str, live_range: str, assignment: str) -> dict[int, tuple[int, int, int]]:
    """Per primal equation, the most bytes of scratch XLA holds at once while it
    transposes it (see the module's docstring): in the backward proper; in
    the part of the transpose that reads forward values only (which XLA can
    run in the forward of code run as written, and runs in the backward of
    code a fenced segment recomputes); and of that part, what the backward
    proper reads, so that code run as written holds it from the forward to
    the backward (max pooling's buffer of the padded input's shape, which
    its backward scatters into; not the index search's intermediates).
    Equations with none are left out.

    Args:
        hlo: the optimized module's text (``*after_optimizations.txt``).
        live_range: XLA's live ranges (``*after_optimizations-live-range.txt``).
        assignment: XLA's buffer assignment (``*after_optimizations-buffer-assignment.txt``).
    """
    entry, computations = parse_module(hlo)
    instructions = computations.get(entry, [])
    readers = _readers(instructions)
    owner = _owners(instructions, computations, readers)
    scratch = _scratch_values(instructions, owner, computations, readers)
    if not scratch:
        return {}
    slices = _slices(assignment)
    live: dict[tuple[int, bool], dict[int, dict[tuple[int, int], int]]] = defaultdict(lambda: defaultdict(dict))
    every: dict[int, int] = defaultdict(int)  # the forward part, behind a fence, runs breadth-first: all at once
    held: dict[int, int] = defaultdict(int)  # of it, what the backward proper reads
    handed_in = _handed_in(instructions, owner)
    for name, index, start, end in _RANGE.findall(live_range.partition("BufferLiveRange")[2]):
        where = slices.get((name, index))
        if name not in scratch or where is None:
            continue
        allocation, offset, size = where
        for t in range(int(start), int(end) + 1):
            at_t = live[scratch[name]][t]
            at_t[(allocation, offset)] = max(at_t.get((allocation, offset), 0), size)
        if not scratch[name][1]:
            every[scratch[name][0]] += size
            if readers[name] & handed_in:
                held[scratch[name][0]] += size
    peak = {key: max(sum(h.values()) for h in by_time.values()) for key, by_time in live.items()}
    return {eqn: (peak.get((eqn, True), 0), every.get(eqn, 0), held.get(eqn, 0)) for eqn, _ in peak}
