"""How XLA:CPU orders the forward: breadth-first, so parallel branches are live together.

XLA:CPU's scheduler (``xla_cpu_enable_concurrency_optimized_scheduler``, on by
default) runs an instruction as soon as its operands exist, in the order they
came to exist. In a forward of independent branches (several matmuls of one
input, each followed by its own elementwise work and loss term), it computes
every branch's matmul before any branch's ``sin``, and the ``sin`` outputs
before any reduction: each branch's intermediate values wait, live, while the
others catch up, and the forward can peak above every segment's backward. Read
off the schedule and buffer assignment of such plans (docs/measurements.md,
"Keep-set plans: optimal where the answer is known"): at the peak of the
keep-nothing plan, XLA holds one matmul output or ``sin`` output per branch.

This module walks the forward in that order, one unit at a time (a unit's depth
from the program's inputs, then program order), and counts the buffers live at
each step: a value gets a buffer when its producer or a reader reads memory (a
matmul, a reduction; cheap elementwise work fuses into its reader), lives from
its producer to its last forward reader, and to the end of the forward when
the schedule stores it for the backward. A chain's forward holds no more than
its backward does; the count matters where the program branches.

Whether XLA runs branches side by side is the scheduler's choice, and it
differs between XLA releases (jax 0.12's XLA:CPU runs them one after
another): :func:`runs_branches_side_by_side` reads it off a small probe's
compile, and the model counts the forward only where it says so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection

import jax
import jax.numpy as jnp
import numpy as np

from ..program._graph import ALIASING_PRIMITIVES, ProgramGraph, per_graph
from ._fusion import MATERIALIZING_CONSUMERS, REDUCTIONS

READS_MEMORY = MATERIALIZING_CONSUMERS | REDUCTIONS
"""Primitives XLA:CPU reads operands of from memory and writes a buffer for: their
operands and outputs are materialized in the forward."""


def forward_peak_bytes(graph: ProgramGraph, stored: Collection[int]) -> int:
    """The forward's peak, run breadth-first: the program's inputs and primal outputs (no
    gradient is written yet) and the most bytes of forward values live at once.

    Args:
        graph: the program graph.
        stored: the nodes the schedule stores for the backward (live from where they
            are computed to the end of the forward).
    """
    forward = per_graph(_FORWARDS, graph, lambda: _Forward.of(graph))
    kept = np.isin(forward.nodes, np.fromiter(stored, np.int64, len(stored)))
    live = kept | forward.buffered
    last = np.where(kept, forward.steps, forward.last)
    allocated = np.bincount(forward.at[live], forward.sizes[live], minlength=forward.steps + 1)
    freed = np.bincount(last[live], forward.sizes[live], minlength=forward.steps + 1)
    # Live at step i: allocated up to i, less what was freed before it.
    held = np.cumsum(allocated) - np.concatenate(([0], np.cumsum(freed)[:-1]))
    return graph.input_bytes + forward.output_bytes + int(held.max(initial=0))


@dataclasses.dataclass(frozen=True)
class _Forward:
    """What no schedule changes of a graph's forward: its steps, the bytes of its primal outputs,
    and per value it computes (program outputs aside) its node, bytes, the step computing it,
    its last forward reader's step, and whether it gets a buffer unless stored."""

    steps: int
    output_bytes: int
    nodes: np.ndarray
    sizes: np.ndarray
    at: np.ndarray
    last: np.ndarray
    buffered: np.ndarray

    @classmethod
    def of(cls, graph: ProgramGraph) -> _Forward:
        order = _breadth_first(graph)
        step = {u: i for i, u in enumerate(order)}
        rows = []
        for u in order:
            for v in graph.units[u].outputs:
                if graph.is_output[v] or not graph.node_bytes[v]:
                    continue
                readers = _readers(graph, v, step)
                buffered = graph.units[u].primitive in READS_MEMORY or any(
                    graph.units[c].primitive in READS_MEMORY for c in readers)
                rows.append((v, graph.node_bytes[v], step[u], max((step[c] for c in readers), default=step[u]),
                             buffered))
        columns = [np.array(c, dtype=bool if k == 4 else np.int64)
                   for k, c in enumerate(zip(*rows) if rows else ([],) * 5)]
        outputs = sum(b for b, out in zip(graph.node_bytes, graph.is_output) if out)
        return cls(len(order), outputs, *columns)


_FORWARDS: dict[int, _Forward] = {}
"""Per live graph: :class:`_Forward` (the planner simulates many schedules of one graph)."""


def _breadth_first(graph: ProgramGraph) -> list[int]:
    """The forward's units (the user's values, not aliases) by depth from the inputs, then
    program order: the order XLA:CPU's breadth-first scheduler runs them in."""
    units = graph.units
    depth: dict[int, int] = {}
    for u in sorted(graph.primal | {u.index for u in units if u.name is not None}):
        below = max((depth.get(graph.node_unit[w], 0) for w in units[u].inputs), default=0)
        depth[u] = below if units[u].primitive in ALIASING_PRIMITIVES else below + 1
    return sorted((u for u in depth if units[u].primitive not in ALIASING_PRIMITIVES), key=lambda u: (depth[u], u))


def _readers(graph: ProgramGraph, node: int, step: dict[int, int]) -> list[int]:
    """The forward units that read ``node``, through aliases (a ``name``, a reshape)."""
    out: list[int] = []
    stack = [node]
    while stack:
        for c in graph.consumers[stack.pop()]:
            if c in step:
                out.append(c)
            elif graph.units[c].primitive in ALIASING_PRIMITIVES:
                stack.extend(graph.units[c].outputs)
    return out


_SIDE_BY_SIDE: dict[tuple[str, str], bool] = {}

PROBE_ROWS, PROBE_WIDTH, PROBE_BRANCHES = 256, 64, 4


def runs_branches_side_by_side() -> bool:
    """Whether the default backend's XLA holds parallel branches' values side by side in a forward.

    Read off the compile of a probe: :data:`PROBE_BRANCHES` matmuls of one input, each followed
    by its ``sin`` and a mean of squares. Scheduled breadth-first, XLA's temporaries hold every
    branch's output at once; one branch after another, one or none. Once per process, backend
    and ``XLA_FLAGS``.
    """
    key = (jax.default_backend(), os.environ.get("XLA_FLAGS", ""))
    if key not in _SIDE_BY_SIDE:
        x = jax.ShapeDtypeStruct((PROBE_ROWS, PROBE_WIDTH), jnp.float32)
        ws = [jax.ShapeDtypeStruct((PROBE_WIDTH, PROBE_WIDTH), jnp.float32)] * PROBE_BRANCHES
        memory = jax.jit(_probe).lower(x, ws).compile().memory_analysis()
        temp = getattr(memory, "temp_size_in_bytes", 0) if memory is not None else 0
        _SIDE_BY_SIDE[key] = temp > 2 * PROBE_ROWS * PROBE_WIDTH * 4
    return _SIDE_BY_SIDE[key]


def _probe(x: jax.Array, ws: list[jax.Array]) -> jax.Array:
    return sum((jnp.mean(jnp.sin(x @ w) ** 2) for w in ws), jnp.zeros((), jnp.float32))
