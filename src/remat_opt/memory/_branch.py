"""How XLA:CPU orders a fenced segment's backward: breadth-first.

XLA:CPU schedules every computation, each branch of a conditional included,
with its breadth-first scheduler (``xla_cpu_enable_concurrency_optimized_scheduler``,
on by default): an instruction runs as soon as its operands exist. A fenced
segment's backward branch starts from its stored values and its incoming
cotangent at once, so its recomputation and the transposes of the segment's
end run side by side. A recomputed value is computed at its depth in the
recomputation (from the stored values) and lives until the last transpose or
recomputation that reads it; the transposes run at their depth from the
segment's end. Values at the segment's end die early while deep chains (the
first layer's attention, behind a recomputed embedding and layer norm) are
not yet computed, so fewer are live at once than the whole recomputation.
This count gives the recomputed buffers XLA holds at the peak of the demo
GPT's fenced segment; with the depth-first scheduler (``=false``) the same
schedules measure higher (docs/measurements.md, "The breadth-first
scheduler").
"""

from __future__ import annotations

from collections.abc import Iterable

from ..program._graph import ProgramGraph


def live_at_peak(graph: ProgramGraph, members: Iterable[int], recomputed: set[int],
                 sizes: dict[int, list[int]], scratch: dict[int, int] | None = None) -> list[tuple[int, int]]:
    """The recomputed buffers live together when the most recomputed bytes are.

    Args:
        graph: the program graph.
        members: the units of one fenced segment.
        recomputed: the units its backward recomputes (others' outputs are stored).
        sizes: per recomputed unit, the sizes of the buffers it writes.
        scratch: per unit, the scratch of its transpose's part that reads
            forward values only (:attr:`ProgramGraph.scratch`): live for one
            step, once its operands exist, at the unit's own depth.

    Returns:
        ``(unit, size)`` of each recomputed buffer live at the busiest step
        of a breadth-first run of the segment's backward.
    """
    units = graph.units
    members = sorted(members)  # unit indices are in program order; positions repeat
    inside = set(members)
    depth: dict[int, int] = {}  # recomputation, from the stored values
    for u in members:
        if u in recomputed:
            depth[u] = 1 + max((depth.get(graph.node_unit[w], 0) for w in units[u].inputs), default=0)
    step: dict[int, int] = {}  # transposes, from the segment's end
    for u in reversed(members):
        after = [step[c] for v in units[u].outputs for c in graph.consumers[v] if c in inside]
        reads = [depth.get(graph.node_unit[w], 0) for w in (*units[u].inputs, *units[u].outputs) if graph.residual[w]]
        step[u] = 1 + max(after + reads, default=0)
    events: dict[int, list[tuple[tuple[int, int], int]]] = {}
    for u in members:
        if u not in recomputed or not sizes.get(u):
            continue
        readers = [step[u]]
        for v in units[u].outputs:
            readers += [depth[c] for c in graph.consumers[v] if c in depth]
            if graph.residual[v]:
                readers += [step[c] for c in graph.consumers[v] if c in step]
        for size in sizes[u]:
            events.setdefault(depth[u], []).append(((u, size), +1))
            events.setdefault(max(readers) + 1, []).append(((u, size), -1))
    for u, size in (scratch or {}).items():
        if u in inside and size:  # once its operands exist, recomputed or stored
            at = depth.get(u) or 1 + max((depth.get(graph.node_unit[w], 0) for w in units[u].inputs), default=0)
            events.setdefault(at, []).append(((u, size), +1))
            events.setdefault(at + 1, []).append(((u, size), -1))
    live: dict[tuple[int, int], int] = {}
    best: list[tuple[int, int]] = []
    best_bytes = 0
    for t in sorted(events):
        for buffer, d in events[t]:
            live[buffer] = live.get(buffer, 0) + d
        total = sum(size * n for (_, size), n in live.items())
        if total > best_bytes:
            best_bytes = total
            best = [buffer for buffer, n in live.items() for _ in range(n)]
    return best


def live_per_segment(graph: ProgramGraph, seg_of: tuple[int, ...], remat_sizes: dict[int, list[int]],
                     as_written: frozenset[int]) -> dict[int, list[tuple[int, int]]]:
    """:func:`live_at_peak` of every fenced segment that rematerializes a buffer
    or holds a transpose's forward scratch.

    Args:
        graph: the program graph.
        seg_of: the segment of each position.
        remat_sizes: per recomputed unit, the sizes of the buffers it writes.
        as_written: segments that run as written (not fenced; skipped).
    """
    members: dict[int, list[int]] = {}
    for u in graph.units:
        members.setdefault(seg_of[u.position], []).append(u.index)
    recomputed = set(remat_sizes)
    scratch = {u: forward for u, (_, forward, _) in enumerate(graph.scratch) if forward}
    out = {}
    for j, here in members.items():
        sizes = {u: remat_sizes[u] for u in here if u in recomputed}
        if j not in as_written and (any(sizes.values()) or any(u in scratch for u in here)):
            out[j] = live_at_peak(graph, here, recomputed, sizes, scratch)
    return out
