"""XLA's optimized HLO, as text: instructions in schedule order, with the
``op_name`` each was lowered from.

The memory model reads what XLA decided off this text (:mod:`remat_opt.memory._compiled`,
:mod:`remat_opt.memory._scratch`, :mod:`remat_opt.memory._sharded`). The program is
compiled with each primal equation in a name scope ``remat_opt_eqn{i}``
(:mod:`remat_opt.program._names`), which ``op_name`` carries.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

EQN = re.compile(r"remat_opt_eqn(\d+)")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
ARRAY = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")
PASS_THROUGH = frozenset({"bitcast", "tuple", "parameter", "constant"})


@dataclass(frozen=True)
class Instruction:
    """One instruction: its name, shape, opcode, operands, ``op_name`` and, for a fusion, the computation it calls."""

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    op_name: str
    calls: str = ""


_CALLS = re.compile(r"calls=%([\w.\-]+)")
_INDEX = re.compile(r"index=(\d+)")


def array_bytes(shape: str) -> int:
    """Bytes of an array shape's text (``f32[8,16]{1,0}``); 0 for a tuple or token."""
    found = ARRAY.match(shape)
    if not found:
        return 0
    dims = [int(d) for d in found[2].split(",") if d]
    bits = int(re.sub(r"\D", "", found[1]) or 8)  # pred (and token) have no width: a byte
    return int(np.prod(dims, dtype=np.int64)) * max(1, bits // 8)


def parse_module(hlo_text: str) -> tuple[str, dict[str, list[Instruction]]]:
    """The module's computations (name -> instructions, the root last) and its entry's name."""
    computations: dict[str, list[Instruction]] = {}
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
        if not found or current is None:
            continue
        name, shape, opcode, rest = found.groups()
        args = rest.split("), ")[0] if "), " in rest else rest.rsplit(")", 1)[0]
        op_name, calls = _OP_NAME.search(rest), _CALLS.search(rest)
        if opcode == "get-tuple-element":
            index = _INDEX.search(rest)
            opcode = f"get-tuple-element.{index[1] if index else 0}"
        if line.lstrip().startswith("ROOT "):
            root = len(computations[current])
        computations[current].append(Instruction(name, shape, opcode, tuple(_OPERAND.findall(args)),
                                                  op_name[1] if op_name else "", calls[1] if calls else ""))
    return entry, computations


_CALLED = re.compile(r"\b(?:calls|body|condition|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def one_pass_total(hlo_text: str, weight: Callable[[str, str], int]) -> int:
    """The sum of ``weight(opcode, shape)`` over the instructions one run of the module
    executes: from the entry computation down through every computation it calls, a
    conditional's largest branch only (one of them runs), a loop's body once."""
    own: dict[str, int] = {}
    calls: dict[str, list[tuple[bool, list[str]]]] = {}  # per computation: (branches?, callees)
    entry, current = "", ""
    for line in hlo_text.splitlines():
        header = re.match(r"^(ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if header:
            current, entry = header[2], header[2] if header[1] else entry
            own[current], calls[current] = 0, []
            continue
        found = _INSTRUCTION.match(line) if current else None
        if found is None:
            continue
        _, shape, opcode, rest = found.groups()
        own[current] += weight(opcode, shape)
        branches = _BRANCHES.search(rest)
        if branches:
            calls[current].append((True, _OPERAND.findall(branches[1])))
        called = _CALLED.findall(rest)
        if called:
            calls[current].append((opcode == "conditional", called))
    totals: dict[str, int] = {}

    def total(name: str) -> int:
        if name not in totals:
            totals[name] = own.get(name, 0) + sum(max(map(total, callees)) if branch else sum(map(total, callees))
                                                  for branch, callees in calls.get(name, []))
        return totals[name]

    return total(entry)


def origin(instruction: Instruction, computations: dict[str, list[Instruction]], index: int | None) -> str:
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
