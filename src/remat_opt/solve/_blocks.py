"""Identical blocks along a program's chain: the repeated layer of an unrolled model.

A deep model written as a Python loop over layers (or a scan the tracer
unrolled) is one block of equations repeated ``L`` times between a prefix
(embedding) and a suffix (head and loss). :func:`find_blocks` finds that
repetition in the program itself, with no knowledge of the model:

1. Each primal equation gets a token: its primitive, its parameters (with
   memory addresses stripped), and the shapes and dtypes it reads and writes.
   The period ``B`` is the shift under which the longest run of tokens repeats
   itself, covering the most equations; the block boundaries are placed, within
   that run, where the fewest bytes cross.
2. The blocks are then checked on the program graph, unit by unit: block
   ``k + 1`` must be block ``k`` moved by a fixed number of positions, units and
   nodes, with the same primitive, FLOPs, bytes and every fact of the memory
   model on each value (residual, fused, held, transposed, buffer aliasing),
   and the same wiring: an operand inside the block moves with it, an operand
   from before the block is the same entry (by its rank among the values
   crossing the block's start). Parameters differ from block to block; nothing
   else may.
3. The program must be a chain of stages (prefix, blocks, suffix): no value
   is read more than one stage after the one that makes it.

Programs without such a chain (no repetition, a skip connection across
blocks, a value shared by every block) get ``None``, and are planned as a whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..memory._transient import transient_bytes
from ..program._graph import ProgramGraph

MIN_BLOCKS = 2
"""Fewer repetitions than this are not a chain of blocks."""


@dataclass(frozen=True)
class BlockChain:
    """``count`` identical blocks of ``length`` positions from ``start``.

    Block ``k`` holds positions ``[start + k * length, start + (k + 1) * length)``;
    the prefix is ``[0, start)``, the suffix what follows the last block.

    Attributes:
        start: the first position of block 0.
        length: positions per block.
        count: number of blocks.
        unit_step: units between corresponding units of neighbouring blocks.
        node_step: nodes between corresponding nodes of neighbouring blocks.
    """

    start: int
    length: int
    count: int
    unit_step: int
    node_step: int

    def boundary(self, k: int) -> int:
        """The position where block ``k`` starts (``k = count``: where the suffix starts)."""
        return self.start + k * self.length

    def stage_bounds(self, num_positions: int) -> tuple[int, ...]:
        """Positions where the chain's stages start, then its end: prefix (if any),
        each block, suffix (if any)."""
        inner = [self.boundary(k) for k in range(self.count + 1)]
        return tuple(sorted({0, *inner, num_positions}))


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _token(eqn) -> str:
    """What makes two equations the same up to their variables: primitive,
    parameters (addresses stripped) and the avals read and written."""
    params = sorted((k, _ADDRESS.sub("", str(v))) for k, v in eqn.params.items())
    ins = tuple(f"lit:{v}" if not hasattr(v, "count") and hasattr(v, "val") else str(v.aval) for v in eqn.invars)
    return repr((eqn.primitive.name, params, ins, tuple(str(v.aval) for v in eqn.outvars)))


def _longest_run(equal: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest run of True in ``equal``."""
    padded = np.concatenate(([False], equal, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    if edges.size == 0:
        return 0, 0
    starts, stops = edges[::2], edges[1::2]
    k = int(np.argmax(stops - starts))
    return int(stops[k] - starts[k]), int(starts[k])


def repeated_period(codes: np.ndarray) -> tuple[int, int, int] | None:
    """The period covering the most equations with at least :data:`MIN_BLOCKS`
    repetitions, as ``(period, first position of the repeated run, its length)``."""
    n = len(codes)
    best = None  # (covered, period, start, run)
    for period in range(1, n // MIN_BLOCKS + 1):
        run, start = _longest_run(codes[:-period] == codes[period:])
        covered = (run + period) // period * period
        if run + period >= MIN_BLOCKS * period and (best is None or covered > best[0]):
            best = (covered, period, start, run + period)
    return None if best is None else best[1:]


def _stage_of(bounds: tuple[int, ...], num_positions: int) -> np.ndarray:
    return np.searchsorted(np.asarray(bounds[1:]), np.arange(num_positions), side="right")


def is_stage_chain(graph: ProgramGraph, bounds: tuple[int, ...]) -> bool:
    """Whether every value is read only in its own stage and the next one."""
    stage = _stage_of(bounds, graph.num_positions)
    for v, readers in enumerate(graph.consumers):
        p = graph.position_of(v)
        last = max((graph.units[u].position for u in readers), default=p)
        if stage[last] - stage[p] > 1:
            return False
    return True


def value_spans(graph: ProgramGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the position that makes it and the last position that reads it."""
    made = np.array([graph.position_of(v) for v in range(graph.num_nodes)], dtype=np.int64)
    last = made.copy()
    for v, readers in enumerate(graph.consumers):
        for u in readers:
            last[v] = max(last[v], graph.units[u].position)
    return made, last


def crossing_values(spans: tuple[np.ndarray, np.ndarray], boundary: int) -> tuple[int, ...]:
    """The values crossing ``boundary`` (made before it, read at or after it), by node id."""
    made, last = spans
    return tuple(int(v) for v in np.flatnonzero((made < boundary) & (last >= boundary)))


def _node_facts(graph: ProgramGraph, v: int) -> tuple:
    facts = [graph.node_bytes[v], graph.residual[v], graph.is_output[v], graph.node_shape[v], graph.node_dtype[v]]
    for field in (graph.fused, graph.held, graph.transposed, graph.reduced):
        facts.append(bool(field and field[v]))
    return tuple(facts)


def _unit_facts(graph: ProgramGraph, u: int) -> tuple:
    unit = graph.units[u]
    inner = graph.inner_bytes[u] if graph.inner_bytes else 0
    return (unit.primitive, unit.flops, unit.name is None, u in graph.primal, inner, transient_bytes(graph, u),
            transient_bytes(graph, u, fenced=True), transient_bytes(graph, u, recomputed=True))


def _block_units(graph: ProgramGraph, lo: int, hi: int) -> list[int]:
    return [u.index for u in graph.units if lo <= u.position < hi]


def _moves_to(graph: ProgramGraph, spans, chain: tuple[int, int], k: int, steps: tuple[int, int]) -> bool:
    """Whether block ``k + 1`` is block ``k`` moved by ``steps`` (units, nodes), in
    every fact the memory model reads and in its wiring (see the module docstring)."""
    start, length = chain
    lo, mid, hi = start + k * length, start + (k + 1) * length, start + (k + 2) * length
    here, there = _block_units(graph, lo, mid), _block_units(graph, mid, hi)
    du, dn = steps
    if len(here) != len(there) or any(b - a != du for a, b in zip(here, there)):
        return False
    rank_here = {v: i for i, v in enumerate(crossing_values(spans, lo))}
    rank_there = {v: i for i, v in enumerate(crossing_values(spans, mid))}

    def same_node(a: int, b: int) -> bool:
        if graph.position_of(a) >= lo:  # inside the block: moves with it
            return b == a + dn
        return a in rank_here and rank_here[a] == rank_there.get(b)

    for a, b in zip(here, there):
        ua, ub = graph.units[a], graph.units[b]
        if ub.position != ua.position + length or _unit_facts(graph, a) != _unit_facts(graph, b):
            return False
        if len(ua.inputs) != len(ub.inputs) or not all(map(same_node, ua.inputs, ub.inputs)):
            return False
        if ub.outputs != tuple(v + dn for v in ua.outputs):
            return False
        for v, w in zip(ua.outputs, ub.outputs):
            if _node_facts(graph, v) != _node_facts(graph, w):
                return False
            bv, bw = graph.buffer[v], graph.buffer[w]
            shared = bv == bw and (bv < 0 or graph.position_of(bv) < lo)  # one buffer for all (XLA's CSE)
            if not (shared or (bv >= 0 and bw >= 0 and same_node(bv, bw))):
                return False
    return True


def _phase(graph: ProgramGraph, period: int, run_start: int, run: int) -> tuple[int, int]:
    """Where block 0 starts in the repeated run, and how many blocks fit: the most
    blocks, then the fewest bytes crossing the boundary."""
    def key(phase: int) -> tuple[int, int, int]:
        return (-((run - phase) // period), graph.crossing_bytes(run_start + phase), phase)
    phase = min(range(period), key=key)
    return run_start + phase, (run - phase) // period


def find_blocks(graph: ProgramGraph) -> BlockChain | None:
    """The chain of identical blocks in ``graph``, or ``None`` (see the module docstring).

    Returns:
        The longest run of at least :data:`MIN_BLOCKS` consecutive blocks that
        pass every check, on a program that is a chain of stages around them.
    """
    eqns = graph.traced.jaxpr.jaxpr.eqns
    codes: dict[str, int] = {}
    found = repeated_period(np.array([codes.setdefault(_token(e), len(codes)) for e in eqns], dtype=np.int64))
    if found is None:
        return None
    period, start, count = found[0], *_phase(graph, *found)
    if count < MIN_BLOCKS:
        return None
    spans = value_spans(graph)
    first = _block_units(graph, start, start + period)
    second = _block_units(graph, start + period, start + 2 * period)
    if not first or not second or not graph.units[first[0]].outputs or not graph.units[second[0]].outputs:
        return None
    steps = (second[0] - first[0], graph.units[second[0]].outputs[0] - graph.units[first[0]].outputs[0])
    ok = [_moves_to(graph, spans, (start, period), k, steps) for k in range(count - 1)]
    best = (0, 0)  # (blocks, -first block) of the longest run of checked moves
    k = 0
    while k < len(ok):
        if ok[k]:
            j = k
            while j < len(ok) and ok[j]:
                j += 1
            best = max(best, (j - k + 1, -k))
            k = j
        k += 1
    if best[0] < MIN_BLOCKS:
        return None
    chain = BlockChain(start + -best[1] * period, period, best[0], *steps)
    return chain if is_stage_chain(graph, chain.stage_bounds(graph.num_positions)) else None


def stage_bounds(graph: ProgramGraph, chain: BlockChain) -> tuple[int, ...]:
    """The chain's stages made finer: each block split at the positions no more
    bytes cross than cross a block boundary (in a pre-LN transformer, after the
    attention's residual add), the same positions in every block; then the
    prefix and suffix at such positions, each kept where the stages still form
    a chain. Where the split blocks would not, the blocks' own bounds."""
    n, lo = graph.num_positions, chain.boundary(0)
    width = graph.crossing_bytes(lo)
    inner = [p for p in range(lo + 1, lo + chain.length) if graph.crossing_bytes(p) <= width]
    bounds = set(chain.stage_bounds(n)) | {p + k * chain.length for p in inner for k in range(chain.count)}
    if not is_stage_chain(graph, tuple(sorted(bounds))):
        return chain.stage_bounds(n)
    for p in range(1, n):
        outside = not lo <= p <= chain.boundary(chain.count)
        if outside and graph.crossing_bytes(p) <= width and is_stage_chain(graph, tuple(sorted(bounds | {p}))):
            bounds.add(p)
    return tuple(sorted(bounds))
