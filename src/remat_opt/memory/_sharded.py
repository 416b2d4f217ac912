"""Sharded programs: what XLA's SPMD partitioner made of the program, per device.

A gradient step over a mesh (``NamedSharding`` arguments, or ``jax.ShapeDtypeStruct``
with ``sharding=``) is compiled by JAX's own partitioner, and its
``memory_analysis()`` describes one device's share: the budget of a sharded
program is per device. The graph (:mod:`remat_opt.program._graph`) sizes
values from their global avals, so for a sharded program it is resized to one
device's bytes here, from XLA itself:

- **Arguments** take their sharding's shard shape.
- **Intermediates** take XLA's propagated sharding: the plain program is
  compiled once as the graph evaluates it (each primal equation in its name
  scope ``remat_opt_eqn{i}``, :mod:`remat_opt.program._names`), and each value
  takes the per-device shape of the forward instruction lowered from its
  equation with the same rank and element size whose dims divide its global
  dims (the instruction named after its primitive first; the largest if
  several, which errs on the side of memory). A value no instruction matches
  (XLA fused it without a trace, or folded it) takes the share of its first
  operand of the same size, else its global bytes.
- **Collectives** XLA inserted in the forward (an FSDP weight's all-gather,
  attributed by XLA to the ``dot_general`` or ``sharding_constraint`` it feeds)
  are charged to that equation: recomputing it repeats them
  (:class:`remat_opt.program._cost.Interconnect` turns their bytes into FLOPs).

:func:`collective_bytes` reads the bytes every collective of a compiled step
moves per device, for the measured side of a plan.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..program._cost import Interconnect
from ..program._graph import ProgramGraph, Unit, _crossing_profile, aval_bytes
from ..program._manual import named_program
from ..program._static import mesh_sharding, split
from ..program._trace import TracedProgram
from ._compiled import _compiled_afresh
from ._hlo import ARRAY, EQN, one_pass_total, parse_module
from ._measure import StepCall, abstract, gradient_step, memory_of

_COLLECTIVE = re.compile(r"^(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?$")
_ARRAYS = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_BITS = re.compile(r"\d+")


def is_sharded(args: Any, kwargs: Any) -> bool:
    """Whether some argument leaf is laid out over several devices (:func:`mesh_sharding`)."""
    leaves, _ = split((args, kwargs))
    return any(mesh_sharding(x) is not None for x in leaves)


@dataclass(frozen=True)
class _Forward:
    """One forward HLO instruction lowered from a primal equation."""

    eqn: int
    primitive: str
    dims: tuple[int, ...]
    itemsize: int
    collective_bytes: int
    opcode: str = ""
    argument: str = ""  # a collective XLA names after the argument it moves (jax 0.12): its key path


@dataclass(frozen=True)
class Partitioned:
    """XLA's partitioned plain program: its peak and per-device facts.

    Attributes:
        peak_bytes: one device's peak (argument + output + temp − alias).
        forward: the forward instructions that name a primal equation.
        collective_bytes: bytes all its collectives move per device.
    """

    peak_bytes: int
    forward: tuple[_Forward, ...]
    collective_bytes: int


def _shapes(shape: str) -> list[tuple[tuple[int, ...], int]]:
    """Each array of an HLO shape (a tuple shape has several): dims and item size."""
    out = []
    for kind, dims in _ARRAYS.findall(shape):
        bits = _BITS.search(kind)
        out.append((tuple(int(d) for d in dims.split(",") if d), max(1, int(bits[0]) // 8) if bits else 1))
    return out


def collective_bytes(hlo_text: str) -> int:
    """Bytes the collectives of a compiled (partitioned) program write per device, on one
    pass through it (:func:`remat_opt.memory._hlo.one_pass_total`: a conditional counts its
    largest branch, the fence's two branches being the same computation twice): the outputs
    of every all-gather, all-reduce, reduce-scatter, all-to-all and collective-permute."""
    return one_pass_total(hlo_text, _instruction_collective)


def _kind(opcode: str) -> str:
    return opcode.removesuffix("-start") if _COLLECTIVE.match(opcode) else ""


def _instruction_collective(opcode: str, shape: str) -> int:
    if not _COLLECTIVE.match(opcode):
        return 0
    return sum(int(np.prod(d, dtype=np.int64)) * size for d, size in _shapes(shape))


def read_partitioned(call: StepCall, traced: TracedProgram) -> Partitioned:
    """Compiles the plain program of ``traced`` (``call.fn`` traced) on the call's (sharded,
    abstract) arguments, every equation in its name scope, and reads its partitioned forward
    (of a ``shard_map`` body: the body's equations, named inside its call)."""
    step, step_args, step_kwargs = gradient_step(named_program(call.fn, traced), call.args, call.kwargs,
                                                 call.argnums, call.has_aux)
    with _compiled_afresh():  # an executable from JAX's disk cache may have lost its op_name metadata
        compiled = jax.jit(step).lower(*abstract(step_args), **abstract(step_kwargs)).compile()
    text = compiled.as_text()
    if text is None:  # jax: "unavailable, e.g. based on backend, compiler, or runtime"
        raise RuntimeError(f"XLA gives no text of the compiled program on backend {jax.default_backend()!r}: "
                           "its partitioned forward cannot be read.")
    _, computations = parse_module(text)
    forward = []
    for body in computations.values():
        for i in body:
            found = EQN.findall(i.op_name)
            if not found and _COLLECTIVE.match(i.opcode) and "[" in i.op_name and "(" not in i.op_name:
                # jax 0.12 names a weight's gather after the argument: charged to its first reader
                path = i.op_name.replace("\\", "")
                forward.append(_Forward(-1, "", (), 0, _instruction_collective(i.opcode, i.shape),
                                        _kind(i.opcode), path[path.index("["):]))
                continue
            if not found or "transpose(" in i.op_name or ":" in i.op_name:  # backward, or merged ops
                continue
            arrays = _shapes(i.shape) if ARRAY.match(i.shape) else []
            dims, size = arrays[0] if arrays else ((), 0)
            forward.append(_Forward(int(found[-1]), i.op_name.rsplit("/", 1)[-1], dims if arrays else (-1,),
                                    size, _instruction_collective(i.opcode, i.shape), _kind(i.opcode)))
    return Partitioned(memory_of(compiled), tuple(forward), collective_bytes(text))


def per_device_graph(graph: ProgramGraph, partitioned: Partitioned, args: tuple, kwargs: dict,
                     interconnect: Interconnect) -> ProgramGraph:
    """``graph`` with one device's bytes (see the module's docstring) and each
    equation's forward collectives priced into its FLOPs."""
    leaves, _ = split((args, kwargs))
    in_avals = [v.aval for v in graph.traced.jaxpr.jaxpr.invars]
    input_bytes = [_input_bytes(x, a) for x, a in zip(leaves, in_avals)]
    by_eqn: dict[int, list[_Forward]] = {}
    for f in partitioned.forward:
        by_eqn.setdefault(f.eqn, []).append(f)
    node_bytes = list(graph.node_bytes)
    share: list[float] = [1.0] * graph.num_nodes
    for v in range(graph.num_nodes):
        unit = graph.units[graph.node_unit[v]]
        local = _local_bytes(graph, v, unit, by_eqn.get(unit.position, []))
        if local is None:  # no instruction of its own: its operand's share
            local = int(np.ceil(graph.node_bytes[v] * _operand_share(graph, v, unit, share, input_bytes)))
        node_bytes[v] = min(graph.node_bytes[v], local)
        share[v] = node_bytes[v] / graph.node_bytes[v] if graph.node_bytes[v] else 1.0
    units = _priced_units(graph, partitioned, interconnect)
    diff_bytes = sum(b for b, d in zip(input_bytes, graph.traced.differentiable) if d)
    outputs = graph.output_bytes - sum(aval_bytes(a) for a, d in zip(in_avals, graph.traced.differentiable) if d)
    consumers = [list(c) for c in graph.consumers]
    return dataclasses.replace(
        graph, units=units, node_bytes=tuple(node_bytes), input_bytes=sum(input_bytes),
        output_bytes=outputs + diff_bytes,
        crossing=_crossing_profile(list(units), list(graph.node_unit), node_bytes, consumers, graph.num_positions))


def _input_bytes(leaf: Any, aval: Any) -> int:
    """One device's bytes of an argument: its shard's."""
    sharding = mesh_sharding(leaf)
    total = aval_bytes(aval)
    if sharding is None or not getattr(aval, "shape", ()):
        return total
    shard = sharding.shard_shape(tuple(aval.shape))
    return int(np.prod(shard, dtype=np.int64)) * (total // max(1, int(np.prod(aval.shape, dtype=np.int64))))


def _local_bytes(graph: ProgramGraph, v: int, unit: Unit, forward: list[_Forward]) -> int | None:
    shape, total = graph.node_shape[v], graph.node_bytes[v]
    elements = int(np.prod(shape, dtype=np.int64))
    if not elements:
        return total
    itemsize = total // elements
    fits = [f for f in forward if len(f.dims) == len(shape) and f.itemsize == itemsize
            and all(0 < d <= g and g % d == 0 for d, g in zip(f.dims, shape))]
    named = [f for f in fits if f.primitive == unit.primitive]
    chosen = named or fits
    if not chosen:
        return None
    return max(int(np.prod(f.dims, dtype=np.int64)) for f in chosen) * itemsize


def _operand_share(graph: ProgramGraph, v: int, unit: Unit, share: list[float], input_bytes: list[int]) -> float:
    """The per-device share of ``unit``'s first operand of ``v``'s size, else 1."""
    size = graph.node_bytes[v]
    for u in unit.inputs:
        if graph.node_bytes[u] == size:
            return share[u]
    for k, readers in enumerate(graph.input_readers):
        total = aval_bytes(graph.traced.jaxpr.jaxpr.invars[k].aval)
        if unit.index in readers and total == size and total:
            return input_bytes[k] / total
    return 1.0


def _priced_units(graph: ProgramGraph, partitioned: Partitioned, interconnect: Interconnect) -> tuple[Unit, ...]:
    """Units with their forward collectives' bytes priced in (:func:`unit_collectives`)."""
    extra = unit_collectives(graph, partitioned)
    return tuple(dataclasses.replace(u, flops=u.flops + interconnect.flops_of(extra[u.index][0]))
                 if u.index in extra else u for u in graph.units)


def unit_collectives(graph: ProgramGraph, partitioned: Partitioned) -> dict[int, tuple[int, tuple[str, ...]]]:
    """Per unit index, the bytes and kinds (HLO opcodes) of the forward
    collectives charged to it: each on the unit at its position whose primitive
    XLA named, else the position's first unit; one XLA names after an argument
    (jax 0.12), on the argument's first reader. What recomputing the unit moves again."""
    at: dict[int, list[Unit]] = {}
    for unit in graph.units:
        at.setdefault(unit.position, []).append(unit)
    out: dict[int, tuple[int, tuple[str, ...]]] = {}
    for f in partitioned.forward:
        owner = _first_reader(graph, f.argument) if f.argument and f.collective_bytes else None
        if owner is None and f.collective_bytes and f.eqn in at:
            owner = next((u for u in at[f.eqn] if u.primitive == f.primitive), at[f.eqn][0]).index
        if owner is not None:
            size, kinds = out.get(owner, (0, ()))
            out[owner] = (size + f.collective_bytes, kinds + ((f.opcode,) if f.opcode not in kinds else ()))
    return out


def _first_reader(graph: ProgramGraph, key_path: str) -> int | None:
    """The first unit reading the argument at ``key_path`` (``['layers'][0]['w']``)."""
    for label, readers in zip(graph.input_labels, graph.input_readers):
        if label.endswith(key_path) and readers:
            return min(readers)
    return None


def sharded_graph(graph: ProgramGraph, call: StepCall,
                  interconnect: Interconnect) -> tuple[ProgramGraph, Partitioned | None]:
    """``graph`` (of ``call.fn`` on its arguments) sized for one device when the arguments
    are sharded (else as it is), and XLA's partitioned plain program it was read from
    (else ``None``)."""
    args, kwargs = call.args, call.kwargs
    if graph.traced.manual is not None:  # a shard_map body: one device's values already
        graph = with_outside_bytes(graph, args, kwargs)
    if not is_sharded(args, kwargs):
        return graph, None
    partitioned = read_partitioned(call, graph.traced)
    if graph.traced.manual is not None:  # its collectives priced
        return dataclasses.replace(graph, units=_priced_units(graph, partitioned, interconnect)), partitioned
    return per_device_graph(graph, partitioned, args, kwargs, interconnect), partitioned


def with_outside_bytes(graph: ProgramGraph, args: tuple, kwargs: dict) -> ProgramGraph:
    """The graph of a ``shard_map`` body with what lives outside it while its backward runs,
    on each device: the program's arguments the call does not read (a loss's targets), and
    the cotangents of the call's outputs (a loss outside it computes them first)."""
    manual = graph.traced.manual
    outer = manual.outer.jaxpr.jaxpr
    leaves, _ = split((args, kwargs))
    read = set(outer.eqns[manual.position].invars)
    outside = sum(_input_bytes(x, v.aval) for x, v in zip(leaves, outer.invars) if v not in read)
    cotangents = sum(aval_bytes(v.aval) for v in graph.traced.jaxpr.jaxpr.outvars)
    return dataclasses.replace(graph, input_bytes=graph.input_bytes + outside,
                               output_bytes=graph.output_bytes + cotangents)


def with_shardings(args: tuple, in_shardings: Any) -> tuple:
    """The abstract positional ``args`` laid out as ``in_shardings`` says, as
    ``jax.jit(..., in_shardings=...)`` takes it: one entry per positional
    argument, each a sharding for the whole argument or a pytree prefix of it
    (``None`` leaves an argument's own layout). A single sharding applies to
    every argument.

    Raises:
        TypeError: ``in_shardings`` is not a sharding, ``None``, or a tuple or
            list of one entry per positional argument matching their pytrees.
    """
    if in_shardings is None:
        return args
    if isinstance(in_shardings, jax.sharding.Sharding):
        in_shardings = (in_shardings,) * len(args)
    if not isinstance(in_shardings, (tuple, list)) or len(in_shardings) != len(args):
        raise TypeError(f"in_shardings must be a jax.sharding.Sharding or a tuple with one entry per positional "
                        f"argument ({len(args)}), as jax.jit takes it; got {in_shardings!r}.")

    def laid_out(sharding: Any, subtree: Any) -> Any:
        if sharding is None:
            return subtree
        if not isinstance(sharding, jax.sharding.Sharding):
            raise TypeError(f"in_shardings holds {sharding!r}; each leaf must be a jax.sharding.Sharding or None.")
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
            if isinstance(x, jax.ShapeDtypeStruct) else x, subtree)

    try:
        return tuple(jax.tree_util.tree_map(laid_out, tuple(in_shardings), args, is_leaf=lambda s: s is None))
    except ValueError as err:  # the structures differ
        raise TypeError(f"in_shardings does not match the arguments' pytrees ({err}); give a sharding per "
                        "argument, or a pytree prefix of it.") from err


@dataclass(frozen=True)
class Collective:
    """One forward equation XLA lowered to a collective, and what a plan does with its value.

    Attributes:
        primitive: the equation's primitive (``sharding_constraint`` for an
            explicit FSDP gather, ``dot_general`` for one XLA put before a dot,
            ``shard_map`` for a body's ``psum``).
        source: the user's source line.
        bytes: bytes its collectives move per device, once.
        kinds: the collectives (HLO opcodes: ``all-gather``, ``all-reduce``...).
        decision: ``"saved"`` (stored for the backward), ``"repeated"``
            (recomputed in the backward: its collectives run again; for an
            all-gather, the weight is gathered again) or ``"held"`` (code that
            runs as written: XLA keeps the value).
    """

    primitive: str
    source: str
    bytes: int
    kinds: tuple[str, ...]
    decision: str

    def __str__(self) -> str:
        again = {"all-gather": "gathered again"}.get(self.kinds[0], "run again") if self.kinds else "run again"
        what = {"saved": "saved", "held": "held (runs as written)", "repeated": f"recomputed: {again}"}
        return f"{'+'.join(self.kinds)} {self.bytes:,} bytes in {self.primitive} at {self.source}: " \
               f"{what[self.decision]}"


_DECISIONS = {"save": "saved", "recompute": "repeated", "output": "saved"}


def collective_decisions(graph: ProgramGraph, partitioned: Partitioned, decisions: dict[int, str]) -> tuple[
        Collective, ...]:
    """Per collective equation, in program order, the plan's decision on its value
    (``decisions``: node id to the plan graph's ``decision`` attribute)."""
    out = []
    for index, (size, kinds) in sorted(unit_collectives(graph, partitioned).items()):
        unit = graph.units[index]
        decision = decisions.get(unit.outputs[0], "free") if unit.outputs else "free"
        out.append(Collective(unit.primitive, unit.source, size, kinds, _DECISIONS.get(decision, "held")))
    return tuple(out)
