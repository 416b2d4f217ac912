"""A plan a person can read: a table per segment, a DOT export and a memory plot.

Everything here reads the plan's networkx graph (:attr:`remat_opt.Plan.graph`),
whose nodes carry ``decision``, ``segment``, ``bytes``, ``flops``, ``position``,
``primitive`` and ``source`` (the user's line), and the model's peak per
segment (:attr:`remat_opt.Plan.segment_peaks`). matplotlib and pydot are
imported only by the function that draws with them.

A plan reaches here as a :class:`ReportedPlan`, the attributes of
:class:`remat_opt.Plan` the report reads: ``_plan`` imports this module (its
``report``, ``to_dot`` and ``plot`` are these functions), not the reverse.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import networkx as nx

from ._budget import format_bytes
from ._schedule import Schedule
from .memory._fragmentation import Fragmentation

SAVED = "saved by name"
STORED = "stored"
RECOMPUTED = "recomputed"


class ReportedPlan(Protocol):
    """What the report reads of a :class:`remat_opt.Plan` (see its attributes)."""

    @property
    def graph(self) -> nx.DiGraph: ...
    @property
    def schedule(self) -> Schedule | None: ...
    @property
    def strategy(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def measured_peak_bytes(self) -> int | None: ...
    @property
    def plain_peak_bytes(self) -> int | None: ...
    @property
    def recompute_flops(self) -> int: ...
    @property
    def recompute_overhead(self) -> float: ...
    @property
    def segment_peaks(self) -> tuple[int, ...]: ...
    @property
    def whole_policy(self) -> str | None: ...
    @property
    def loop_plan(self) -> object | None: ...


def _label(plan: ReportedPlan, graph: nx.DiGraph, v: int) -> str | None:
    """What the plan does with value ``v``, as the report says it."""
    decision = graph.nodes[v].get("decision")
    if decision == "save":
        return SAVED if plan.schedule is not None and v in plan.schedule.saved else STORED
    if decision == "recompute" and graph.nodes[v]["primitive"] != "name":  # a name is its value's alias
        return RECOMPUTED
    return None


def _named(graph: nx.DiGraph, v: int) -> int:
    """The value a ``name`` node names (itself for any other node)."""
    if graph.nodes[v]["primitive"] == "name":
        return next(iter(graph.predecessors(v)), v)
    return v


def _flops(graph: nx.DiGraph, nodes: Iterable[int]) -> int:
    """FLOPs to compute ``nodes`` once: each equation counted once, however many
    outputs of it are listed (every output node carries its equation's FLOPs)."""
    units = {}
    for v in nodes:
        d = graph.nodes[v]
        units[(d["position"], d["primitive"], frozenset(graph.predecessors(v)))] = d["flops"]
    return sum(units.values())


def _source(text: str) -> str:
    """``file:line``, relative to the working directory when the file is under it."""
    if not text:
        return "(no user line)"
    path, _, line = text.rpartition(":")
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return text
    return text if rel.startswith("..") else f"{rel}:{line}"


def segment_rows(plan: ReportedPlan) -> dict[int, list[dict[str, Any]]]:
    """Per segment, one row per (what is done, source line): ``what``, ``source``,
    ``values`` (how many), ``nodes`` (their ids in :attr:`Plan.graph`), ``bytes``,
    ``flops`` and ``primitives``.

    A ``name`` node and the value it names are one buffer, counted once, as
    the value (saved by name when either is in the schedule's saved names).
    """
    graph = plan.graph
    order = {SAVED: 0, STORED: 1, RECOMPUTED: 2}
    decided: dict[int, str] = {}
    for v, data in graph.nodes(data=True):
        label = _label(plan, graph, v)
        if label is not None and data.get("segment") is not None:
            u = _named(graph, v)
            decided[u] = min(label, decided.get(u, label), key=order.__getitem__)
    groups: dict[tuple[int, str, str], list[int]] = defaultdict(list)
    for u, label in decided.items():
        data = graph.nodes[u]
        groups[(data["segment"], label, data["source"])].append(u)
    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (segment, label, source), nodes in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]],
                                                                                   kv[0][2])):
        rows[segment].append({
            "what": label, "source": source, "values": len(nodes), "nodes": sorted(nodes),
            "bytes": sum(graph.nodes[v]["bytes"] for v in nodes), "flops": _flops(graph, nodes),
            "primitives": sorted({graph.nodes[v]["primitive"] for v in nodes}),
        })
    return dict(rows)


def _positions(graph: nx.DiGraph) -> dict[int, tuple[int, int]]:
    """Per segment, its first and last position (primal equation)."""
    spans: dict[int, list[int]] = defaultdict(list)
    for _, data in graph.nodes(data=True):
        if data.get("segment") is not None and data.get("position", -1) >= 0:
            spans[data["segment"]].append(data["position"])
    return {s: (min(p), max(p)) for s, p in spans.items()}


def report(plan: ReportedPlan, fragmentation: Fragmentation | None = None) -> str:
    """The plan as text: its one-line summary, then per segment its positions,
    the model's peak there, and what it saves and recomputes, by source line.

    Args:
        plan: the plan.
        fragmentation: when given (:func:`remat_opt.fragmentation` of the
            optimized function), a second line sets the bytes live at XLA's
            peak against those it allocated.

    Example:
        >>> print(step.plan(params, batch).report())  # doctest: +SKIP
    """
    lines = [str(plan)]
    if fragmentation is not None:
        lines.append(f"fragmentation: {fragmentation}")
    graph = plan.graph
    if plan.whole_policy is not None:
        lines.append(f"jax.checkpoint around the whole function with {plan.whole_policy}, measured on XLA: "
                     "no decisions per value to report.")
        return "\n".join(lines)
    if plan.schedule is None or all(d is None for _, d in graph.nodes(data="decision")):
        lines.append("This plan is not a schedule on the program graph: no decisions per value to report.")
        return "\n".join(lines)
    if plan.loop_plan is not None:
        lines.append(f"Loop plan ({plan.loop_plan}): the values below are those of the loop program as written; "
                     "the scans' bodies are checkpointed whole.")
    rows, spans = segment_rows(plan), _positions(graph)
    segments = sorted(set(spans) | set(rows))
    lines.append(f"{len(segments)} segment(s); the backward runs them from the last to the first, "
                 "the last as written.")
    header = f"  {'':14} {'values':>6} {'bytes':>11} {'FLOPs':>15}  {'primitives':<28} source"
    for segment in segments:
        lo, hi = spans.get(segment, (0, 0))
        peak = (f", predicted peak {format_bytes(plan.segment_peaks[segment])}"
                if segment < len(plan.segment_peaks) else "")
        lines.append(f"segment {segment}: positions {lo}-{hi}{peak}")
        seg_rows = rows.get(segment, [])
        if not seg_rows:
            lines.append("  nothing saved or recomputed")
            continue
        lines.append(header)
        for r in seg_rows:
            prims = ", ".join(r["primitives"])
            prims = prims if len(prims) <= 28 else prims[:25] + "..."
            lines.append(f"  {r['what']:14} {r['values']:>6} {format_bytes(r['bytes']):>11} {r['flops']:>15,}  "
                         f"{prims:<28} {_source(r['source'])}")
    totals = {what: [r for rs in rows.values() for r in rs if r["what"] == what] for what in (SAVED, STORED,
                                                                                             RECOMPUTED)}
    lines.append("total: " + "; ".join(
        f"{what} {sum(r['values'] for r in rs)} value(s), {format_bytes(sum(r['bytes'] for r in rs))}"
        for what, rs in totals.items()) + f"; the model counts {plan.recompute_flops:,} FLOPs recomputed "
        "(values that JVP rules derive run once either way)")
    return "\n".join(lines)


_COLOURS = {"input": "lightblue", "output": "gold", "save": "palegreen", "recompute": "salmon", "free": "white"}


def dot_graph(plan: ReportedPlan) -> nx.DiGraph:
    """:attr:`Plan.graph` with attributes Graphviz reads (``label``, ``fillcolor``,
    ``tooltip``); the plan's own attributes are kept, ``shape`` renamed
    ``value_shape`` and ``name`` ``value_name`` (Graphviz and pydot use those)."""
    out = nx.DiGraph()
    for v, data in plan.graph.nodes(data=True):
        attrs = {k: v_ for k, v_ in data.items() if v_ is not None and k not in ("shape", "name")}
        attrs["value_shape"] = str(data.get("shape", ""))
        if data.get("name"):
            attrs["value_name"] = data["name"]
        decision = data.get("decision")
        label = data["name"] if data.get("primitive") == "input" else data["primitive"]
        attrs.update(label=f"{label}\\n{data.get('dtype', '')}{list(data.get('shape', ()))}\\n{decision or ''}",
                     style="filled", fillcolor=_COLOURS.get(decision, "white"), tooltip=data.get("source", ""))
        out.add_node(v, **{k: str(x) for k, x in attrs.items()})
    out.add_edges_from(plan.graph.edges)
    return out


def to_dot(plan: ReportedPlan, path: str | os.PathLike) -> Path:
    """Writes the plan's graph to ``path`` as DOT (``networkx.drawing.nx_pydot``); returns its path.

    Raises:
        ModuleNotFoundError: pydot is not installed; the message says how to get it.
    """
    try:
        import pydot  # noqa: F401  (networkx imports it; checked here for a clear message)
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("Plan.to_dot needs pydot: pip install 'remat_opt[plot]' (or pydot).") from err
    nx.drawing.nx_pydot.write_dot(dot_graph(plan), os.fspath(path))
    return Path(path)


def plot(plan: ReportedPlan, path: str | os.PathLike | None = None) -> Any:
    """The model's peak per segment as bars, with the budget, XLA's measured peak
    and the plain program's peak as horizontal lines.

    Args:
        plan: a plan with :attr:`Plan.segment_peaks` (any plan ``optimize`` made).
        path: where to save the figure (PNG, SVG, ... by its suffix); ``None``
            only returns it.

    Returns:
        The ``matplotlib.figure.Figure``.

    Raises:
        ValueError: the plan has no per-segment prediction (a JAX-policy baseline).
        ModuleNotFoundError: matplotlib is not installed.
    """
    if not plan.segment_peaks:
        raise ValueError(f"plan has no per-segment prediction to plot (strategy {plan.strategy!r}); "
                         "plot a plan from remat_opt.optimize.")
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("Plan.plot needs matplotlib: pip install 'remat_opt[plot]'.") from err
    mib = 2.0**20
    fig = Figure(figsize=(max(8.0, 0.35 * len(plan.segment_peaks) + 5), 4.0), layout="constrained")
    ax = fig.subplots()
    segments = range(len(plan.segment_peaks))
    ax.bar(segments, [p / mib for p in plan.segment_peaks], color="tab:blue", alpha=0.7,
           label="predicted peak in the segment's backward")
    lines = [(plan.budget_bytes, "budget", "tab:red", "--"), (plan.measured_peak_bytes, "XLA's measured peak (step)",
             "black", "-"), (plan.plain_peak_bytes, "plain program (XLA)", "grey", ":")]
    for value, label, colour, style in lines:
        if value is not None:
            ax.axhline(value / mib, color=colour, linestyle=style, label=f"{label}: {format_bytes(value)}")
    ax.set_xlabel("segment (the backward runs them from the last to the first)")
    ax.set_ylabel("MiB")
    ax.set_xticks(list(segments))
    ax.set_title(f"{plan.strategy} {plan.status}: recompute +{plan.recompute_overhead:.1%}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if path is not None:
        fig.savefig(os.fspath(path), dpi=120)
    return fig
