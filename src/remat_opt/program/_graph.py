"""Stage 2 — graph: the program as JAX will differentiate it.

Which values a backward step needs is decided by JAX's JVP rules, not by a
hand table (docs/xla_findings.md §3: the JVP of ``tanh`` uses its raw output, the JVP of
``exp`` its result, a ``dot`` its operands). So the graph is read off JAX
itself: the flat program is evaluated with every value named
(:mod:`remat_opt.program._names`), linearized with :func:`jax.jvp`, and split by
partial evaluation into the *known* program (the forward: primal values and the
residuals derived from them) and the *linear* program (the backward). Every
equation of the known program becomes a compute unit, every value a node
(the split: :mod:`remat_opt.program._linearize`).

A value is a *residual* when the linear program reads it. A residual must be
available in the backward: stored by the forward (saved by name, or crossing a
segment boundary) or recomputed from values that are.

The program is linearized as XLA runs it, where that differs in what gets a
buffer: on XLA:CPU a ``float16``/``bfloat16`` dot or convolution is computed in
``float32`` (:mod:`remat_opt.program._precision`), so its residuals are ``float32`` copies.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import networkx as nx
import numpy as np
from jax.extend import core

from ._cost import CostModel, FlopCostModel
from ._linearize import linearized, reduced_residuals
from ._names import eqn_index_of
from ._source import source_line
from ._trace import TracedProgram

T = TypeVar("T")


def aval_bytes(aval: Any) -> int:
    """Bytes of one array value: elements times item size."""
    if not hasattr(aval, "shape"):
        return 0
    if aval.dtype == jax.dtypes.float0:
        return 0
    # PRNG key dtypes (key<fry>) are JAX's extended dtypes; numpy cannot read them.
    extended = jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended)
    itemsize = aval.dtype.itemsize if extended else np.dtype(aval.dtype).itemsize
    return int(np.prod(aval.shape, dtype=np.int64)) * itemsize


@dataclass(frozen=True)
class Unit:
    """One equation of the known (forward) program.

    Attributes:
        index: position in the known program.
        position: the primal equation it derives from (segment boundaries fall
            between primal equations).
        primitive: primitive name.
        inputs: node ids read (program inputs excluded).
        outputs: node ids written.
        flops: cost of computing it once.
        name: the checkpoint name of its output if it is a ``name`` equation.
        source: the user's source line.
    """

    index: int
    position: int
    primitive: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    flops: int
    name: str | None
    source: str


@dataclass(frozen=True)
class ProgramGraph:
    """The differentiated program as compute units over value nodes.

    :func:`build_graph` fills the program's own fields; ``fused``, ``held``,
    ``transposed``, ``inner_bytes`` and ``plain_storage_scale`` are the memory
    model's facts about the compiler, set by :func:`remat_opt.memory.model_graph`
    and :func:`remat_opt.memory.calibrate`.

    Attributes:
        traced: the flat primal program.
        units: known-program equations in program order.
        node_bytes: bytes per node id (node ids are ``0..len-1``).
        node_unit: producing unit per node id.
        residual: per node id, whether the backward reads it.
        consumers: per node id, the units that read it.
        is_output: per node id, whether it is a primal output (live to the end,
            counted in ``output_bytes``).
        buffer: per node id, the node whose buffer it shares (itself, or the
            input of a bitcast-like unit); ``-1`` for a program input's buffer.
        num_positions: number of primal equations.
        input_bytes: bytes of all program inputs (arguments and constants).
        output_bytes: bytes of the primal outputs plus the gradients.
        node_shape: shape per node id.
        node_dtype: dtype name per node id.
        fused: per node id, a residual XLA fuses into its backward readers.
        crossing: per position ``c``, bytes of values defined before ``c`` and
            read at or after it.
        primal: the units whose recomputation costs extra FLOPs
            (see :func:`primal_units`).
        input_labels: per flat program input, its pytree path
            (``"args[0]['w']"``).
        input_readers: per flat program input, the units that read it.
        transposed: per node id, a value XLA stores in a transposed layout
            (made by a ``transpose``, or by cheap elementwise work on one).
        reduced: per node id, a residual buffer the backward reduces against a
            cotangent (:func:`reduced_residuals`).
        held: per node id, a value the backward holds a buffer for although
            JAX does not list it as a residual: the source a fused residual
            is recomputed from inside XLA's backward fusions
            (:func:`remat_opt.memory._fusion.fused_sources`).
        plain_storage_scale: bytes XLA keeps per byte of residual the model
            stores for code that runs as written (the last segment, or the
            whole plain program); 1 until calibrated against XLA
            (:func:`remat_opt.memory._calibrate.calibrate`).
        planning_storage_scale: the same for the model CP-SAT plans with, which
            charges the last segment's transient whole (the prediction nets it);
            ``None`` means ``plain_storage_scale`` (see :attr:`planning_scale`).
        inner_bytes: per unit, bytes its own backward holds beyond its stored
            residuals: a scan whose body rematerializes reruns it per
            iteration (:mod:`remat_opt.memory._inner`); empty when no unit does.
        summed_at_end: per flat program input, whether XLA adds its
            gradient's partial cotangents (one per reader) in one sum at the
            end of the step, holding each from the backward that writes it
            (read off the compiled program,
            :func:`remat_opt.memory._compiled.deferred_sums`); empty when
            not read.
        scratch: per unit, ``(backward, forward, held)``: bytes XLA holds
            beside the cotangents while it transposes the unit's equation, in
            the backward proper, and in the part that reads forward values
            only, which runs in the backward when the unit is recomputed; and
            of that part, what the backward proper reads, which code run as
            written holds from the forward to the backward (read off
            the compiled program,
            :func:`remat_opt.memory._scratch.transpose_scratch`); empty when
            not read.
    """

    traced: TracedProgram
    units: tuple[Unit, ...]
    node_bytes: tuple[int, ...]
    node_unit: tuple[int, ...]
    residual: tuple[bool, ...]
    consumers: tuple[tuple[int, ...], ...]
    is_output: tuple[bool, ...]
    buffer: tuple[int, ...]
    num_positions: int
    input_bytes: int
    output_bytes: int
    node_shape: tuple[tuple[int, ...], ...]
    node_dtype: tuple[str, ...]
    fused: tuple[bool, ...] = ()
    crossing: tuple[int, ...] = ()
    primal: frozenset[int] = frozenset()
    input_labels: tuple[str, ...] = ()
    input_readers: tuple[tuple[int, ...], ...] = ()
    transposed: tuple[bool, ...] = ()
    reduced: tuple[bool, ...] = ()
    held: tuple[bool, ...] = ()
    plain_storage_scale: float = 1.0
    planning_storage_scale: float | None = None
    inner_bytes: tuple[int, ...] = ()
    summed_at_end: tuple[bool, ...] = ()
    scratch: tuple[tuple[int, int, int], ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.node_bytes)

    @property
    def planning_scale(self) -> float:
        """The storage scale of the planning model: ``planning_storage_scale`` if set."""
        return self.plain_storage_scale if self.planning_storage_scale is None else self.planning_storage_scale

    def position_of(self, node: int) -> int:
        return self.units[self.node_unit[node]].position

    def crossing_bytes(self, cut: int) -> int:
        """Bytes of values defined before position ``cut`` and read at or after it."""
        return self.crossing[cut] if 0 <= cut < len(self.crossing) else 0

    def input_node(self, k: int) -> int:
        """The networkx node id of flat program input ``k`` (after the value nodes)."""
        return self.num_nodes + k

    def nx_graph(self) -> nx.DiGraph:
        """One node per value and per program input; edges from each value read to
        the values computed from it. Program inputs have ``primitive="input"``."""
        g = nx.DiGraph()
        in_avals = [v.aval for v in self.traced.jaxpr.jaxpr.invars]
        for k, (label, aval) in enumerate(zip(self.input_labels, in_avals)):
            g.add_node(
                self.input_node(k),
                primitive="input",
                shape=tuple(getattr(aval, "shape", ())),
                dtype=str(getattr(aval, "dtype", "")),
                bytes=aval_bytes(aval),
                flops=0,
                position=-1,
                name=label,
                residual=False,
                source="",
            )
        for v in range(self.num_nodes):
            unit = self.units[self.node_unit[v]]
            g.add_node(
                v,
                primitive=unit.primitive,
                shape=self.node_shape[v],
                dtype=self.node_dtype[v],
                bytes=self.node_bytes[v],
                flops=unit.flops,
                position=unit.position,
                name=unit.name,
                residual=self.residual[v],
                source=unit.source,
            )
        for unit in self.units:
            for u in unit.inputs:
                for w in unit.outputs:
                    g.add_edge(u, w)
        for k, readers in enumerate(self.input_readers):
            for reader in readers:
                for w in self.units[reader].outputs:
                    g.add_edge(self.input_node(k), w)
        return g


# Primitives whose output XLA lays over its input (a bitcast or the identity):
# one buffer, counted once. ``pvary`` is JAX's cast, inside a ``shard_map``, of a value
# the same on every device to one that varies: a change of type only, the identity on
# each device's data (its transpose, ``psum``, is not).
ALIASING_PRIMITIVES = frozenset(
    {"name", "reshape", "squeeze", "expand_dims", "copy", "optimization_barrier", "stop_gradient", "pvary"}
)

def build_graph(traced: TracedProgram, cost_model: CostModel | None = None) -> ProgramGraph:
    """Linearizes the traced program, as XLA runs it, and returns its compute graph.

    Half-precision dots and convolutions are linearized in float32 where XLA
    computes them so (:mod:`remat_opt.program._precision`): their residuals are float32 copies.

    Args:
        traced: the flat program from :func:`remat_opt.program._trace.trace`.
        cost_model: FLOPs per equation; :class:`FlopCostModel` by default.

    Returns:
        The graph of the known (forward) program with residuals marked.
    """
    cost_model = cost_model or FlopCostModel()
    closed = traced.jaxpr
    known, linear, num_residuals = linearized(traced)
    kj = known.jaxpr
    nodes = _Nodes.of(kj, traced, cost_model)
    residual_vars = {v for v in kj.outvars[len(kj.outvars) - num_residuals:] if isinstance(v, core.Var)}
    residual = [False] * nodes.count
    for v in residual_vars:
        if v in nodes.node_of:
            residual[nodes.node_of[v]] = True
    # Primal outputs and gradients live for the whole step (XLA counts them as output bytes).
    in_avals = [v.aval for v in closed.jaxpr.invars]
    diff_avals = [a for a, d in zip(in_avals, traced.differentiable) if d]
    out_bytes = sum(aval_bytes(v.aval) for v in closed.jaxpr.outvars) + sum(aval_bytes(a) for a in diff_avals)
    is_output = [False] * nodes.count
    for out in kj.outvars[: len(kj.outvars) - num_residuals]:
        if isinstance(out, core.Var) and out in nodes.node_of:
            is_output[nodes.node_of[out]] = True
    reduced = [False] * nodes.count
    for r in reduced_residuals(linear.jaxpr, num_residuals):
        res_var = kj.outvars[len(kj.outvars) - num_residuals + r]
        if isinstance(res_var, core.Var) and res_var in nodes.node_of and nodes.buffer[nodes.node_of[res_var]] >= 0:
            reduced[nodes.buffer[nodes.node_of[res_var]]] = True
    graph = ProgramGraph(
        traced=traced,
        units=tuple(nodes.units),
        node_bytes=tuple(nodes.node_bytes),
        node_unit=tuple(nodes.node_unit),
        residual=tuple(residual),
        consumers=tuple(tuple(c) for c in nodes.consumers),
        is_output=tuple(is_output),
        buffer=tuple(nodes.buffer),
        num_positions=len(closed.jaxpr.eqns),
        input_bytes=sum(aval_bytes(a) for a in in_avals),
        output_bytes=out_bytes,
        node_shape=tuple(nodes.shapes),
        node_dtype=tuple(nodes.dtypes),
        reduced=tuple(reduced),
        crossing=_crossing_profile(nodes.units, nodes.node_unit, nodes.node_bytes, nodes.consumers,
                                   len(closed.jaxpr.eqns)),
        input_labels=input_labels(traced),
        input_readers=tuple(tuple(sorted(r)) for r in nodes.input_readers),
    )
    return dataclasses.replace(graph, primal=primal_units(graph))


@dataclass
class _Nodes:
    """The known program's values and equations, as :func:`build_graph` numbers them:
    per node (an equation's output), its bytes, unit, buffer, shape, dtype and
    readers; per unit, its :class:`Unit`; per program input, the units reading it."""

    node_of: dict = dataclasses.field(default_factory=dict)
    node_bytes: list[int] = dataclasses.field(default_factory=list)
    node_unit: list[int] = dataclasses.field(default_factory=list)
    shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    dtypes: list[str] = dataclasses.field(default_factory=list)
    units: list[Unit] = dataclasses.field(default_factory=list)
    consumers: list[list[int]] = dataclasses.field(default_factory=list)
    buffer: list[int] = dataclasses.field(default_factory=list)
    input_readers: list[set[int]] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.node_bytes)

    @classmethod
    def of(cls, kj: core.Jaxpr, traced: TracedProgram, cost_model: CostModel) -> _Nodes:
        """Every equation of the known program ``kj`` in order, each a unit at the position
        of the primal equation it derives from; a view's output shares its operand's
        buffer, and an equation identical to an earlier one shares that one's (XLA's CSE)."""
        closed, diff = traced.jaxpr, traced.differentiable
        nodes = cls(input_readers=[set() for _ in closed.jaxpr.invars])
        position = 0
        cse: dict = {}
        flat_index = [k for k, d in enumerate(diff) if d] + [k for k, d in enumerate(diff) if not d]
        input_of = {v: flat_index[j] for j, v in enumerate(kj.invars)}  # known input -> flat input
        for i, eqn in enumerate(kj.eqns):
            idx = eqn_index_of(eqn.source_info.name_stack)
            # An equation JAX hoisted out of a rewritten loop's body carries only the body's scope.
            position = idx if idx is not None and idx < len(closed.jaxpr.eqns) else position
            inputs = tuple(sorted({nodes.node_of[v] for v in eqn.invars
                                   if isinstance(v, core.Var) and v in nodes.node_of}))
            outputs = nodes._add_outputs(eqn, i, nodes._alias(eqn, cse))
            for u in inputs:
                nodes.consumers[u].append(i)
            for v in eqn.invars:
                if isinstance(v, core.Var) and v in input_of:
                    nodes.input_readers[input_of[v]].add(i)
            name = eqn.params.get("name") if eqn.primitive.name == "name" else None
            nodes.units.append(Unit(i, position, eqn.primitive.name, inputs, tuple(outputs),
                                    int(cost_model.eqn_flops(eqn)), name, source_line(eqn.source_info.traceback)))
        return nodes

    def _alias(self, eqn: core.JaxprEqn, cse: dict) -> int:
        """The buffer ``eqn``'s one output shares: its operand's for a view (-1 for a
        literal operand), an identical earlier equation's (recorded in ``cse``); -2
        when it writes a buffer of its own."""
        if eqn.primitive.name in ALIASING_PRIMITIVES and len(eqn.invars) == 1 and len(eqn.outvars) == 1:
            src = eqn.invars[0]
            return self.buffer[self.node_of[src]] if isinstance(src, core.Var) and src in self.node_of else -1
        if len(eqn.outvars) == 1 and not eqn.effects:
            key = _cse_key(eqn, self.node_of, self.buffer)
            if key is not None:
                if key in cse:
                    return cse[key]
                cse[key] = self.count
        return -2

    def _add_outputs(self, eqn: core.JaxprEqn, unit: int, alias: int) -> list[int]:
        """Numbers ``eqn``'s outputs as new nodes of ``unit``; returns their ids."""
        outputs = []
        for v in eqn.outvars:
            self.node_of[v] = self.count
            outputs.append(self.count)
            self.node_bytes.append(aval_bytes(v.aval))
            self.node_unit.append(unit)
            self.buffer.append(alias if alias != -2 else self.count - 1)
            self.shapes.append(tuple(getattr(v.aval, "shape", ())))
            self.dtypes.append(str(getattr(v.aval, "dtype", "")))
            self.consumers.append([])
        return outputs


def input_labels(traced: TracedProgram) -> tuple[str, ...]:
    """Each flat input's place in the user's arguments: ``args[0]['w']``, ``kwargs['x']``."""
    n = len(traced.jaxpr.jaxpr.invars)
    paths, _ = jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(traced.in_tree, range(n)))
    labels = []
    for path, _ in paths:
        head = "args" if getattr(path[0], "idx", 0) == 0 else "kwargs"
        labels.append(head + jax.tree_util.keystr(tuple(path[1:])))
    return tuple(labels)


def _crossing_profile(
    units: list[Unit], node_unit: list[int], node_bytes: list[int], consumers: list[list[int]], n: int
) -> tuple[int, ...]:
    """Bytes crossing each position, in one sweep: a value crosses (its position, last reader]."""
    delta = [0] * (n + 1)
    for v, readers in enumerate(consumers):
        p = units[node_unit[v]].position
        last = max((units[u].position for u in readers), default=p)
        if last > p:
            delta[p + 1] += node_bytes[v]
            delta[last + 1] -= node_bytes[v]
    profile, running = [], 0
    for c in range(n):
        running += delta[c]
        profile.append(running)
    return tuple(profile)


def _cse_key(eqn: core.JaxprEqn, node_of: dict, buffer: list[int]) -> tuple | None:
    """What XLA's CSE compares: primitive, parameters and operand buffers."""
    args: list[tuple[str, str, bytes] | tuple[str, int]] = []
    for v in eqn.invars:
        if isinstance(v, core.Literal):
            try:
                args.append(("lit", str(v.aval), np.asarray(v.val).tobytes()))
            except Exception:
                return None
        elif v in node_of:
            args.append(("node", buffer[node_of[v]]))
        else:
            args.append(("in", id(v)))
    try:
        params = repr(sorted(eqn.params.items(), key=lambda kv: kv[0]))
    except Exception:
        return None
    return (eqn.primitive.name, params, str(eqn.outvars[0].aval), tuple(args))


def per_graph(store: dict[int, Any], graph: ProgramGraph, make: Callable[[], T]) -> T:
    """``store``'s value for ``graph`` (kept by id), made by ``make`` on first use and dropped with
    the graph: what the planner asks of one graph many times (a schedule's simulation, say)."""
    key = id(graph)
    if key not in store:
        store[key] = make()
        weakref.finalize(graph, store.pop, key, None)
    return store[key]


def primal_units(graph: ProgramGraph) -> frozenset[int]:
    """Units that compute the user's values (not residuals derived by JVP rules).

    Recomputing a primal unit costs extra FLOPs. A derived unit (``1 - tanh²``
    for the JVP of ``tanh``) runs once either way: in the forward of the plain
    program, in the backward of a rematerialized one. A unit is primal when
    its value flows, within its own position, to a ``name`` unit, a reader at
    a later position, or a program output.
    """
    units = graph.units
    primal: set[int] = set()
    for u in reversed(units):
        for v in u.outputs:
            if graph.is_output[v] or any(
                units[c].position > u.position or units[c].name is not None or c in primal
                for c in graph.consumers[v]
            ):
                primal.add(u.index)
                break
    return frozenset(primal) - {u.index for u in units if u.name is not None}
