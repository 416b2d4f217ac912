"""The model of a program, assembled in one place: trace → program graph → XLA's facts.

The planner (:mod:`remat_opt.planner._optimize`), the plan cache's restore
(:mod:`remat_opt.cache._restore`) and the baselines (:mod:`remat_opt.baselines._reference`)
each model a program the same way, with their own :class:`ModelOptions`: so a graph the
cache rebuilds is the graph the planner planned on, but for what only a compile reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..program._cost import CostModel, Interconnect
from ..program._graph import ProgramGraph, build_graph
from ..program._manual import planned_body
from ..program._trace import TracedProgram, normalize_argnums, trace
from ._compiled import CompiledProgram
from ._facts import check_known, read_plain, with_memory_facts
from ._measure import StepCall
from ._sharded import Partitioned, sharded_graph


@dataclass(frozen=True)
class ModelOptions:
    """How :func:`program_model` models a program; the defaults model it as written
    (scans whole, whole arrays' bytes) with XLA's facts of it.

    Attributes:
        cost_model: FLOPs per equation (:func:`remat_opt.program.build_graph`).
        unroll_scans: scans of at most this many iterations are unrolled where the
            program is traced (0 keeps them whole).
        body: a program whose work is one ``shard_map`` call is modelled by that call's
            body, per device, as the planner plans it (:func:`remat_opt.program._manual.planned_body`).
        interconnect: on a mesh, size each value for one device from XLA's partitioned
            plain program (a compile) and price its collectives on these links
            (:func:`remat_opt.memory._sharded.sharded_graph`); ``None``: no sizing per device.
        xla_facts: read XLA's account of the plain program (a compile, :func:`read_plain`)
            for what no rule of the model knows.
        warn_unknown: without ``xla_facts``, warn where the rules guess (:func:`check_known`).
    """

    cost_model: CostModel | None = None
    unroll_scans: int = 0
    body: bool = False
    interconnect: Interconnect | None = None
    xla_facts: bool = True
    warn_unknown: bool = True

    def rebuilt(self) -> ModelOptions:
        """These options with nothing compiled and no warning: a plan loaded from the cache
        is rebuilt on them (its figures were measured, and the warning given, when it was made)."""
        return dataclasses.replace(self, interconnect=None, xla_facts=False, warn_unknown=False)

    def as_written(self) -> ModelOptions:
        """The program as written, nothing compiled, no warning: scans and a ``shard_map``
        call whole, the rules' facts. How ``fn``'s own program and a loop plan's are modelled."""
        return ModelOptions(self.cost_model, xla_facts=False, warn_unknown=False)


@dataclass(frozen=True)
class ProgramModel:
    """What :func:`program_model` made of a program.

    Attributes:
        graph: the program graph (its ``traced``: the program modelled) with the memory
            model's facts; not calibrated.
        compiled: XLA's account of the plain program (``None`` without ``xla_facts``).
        partitioned: XLA's partitioned plain program, on a mesh with an ``interconnect``; else ``None``.
    """

    graph: ProgramGraph
    compiled: CompiledProgram | None
    partitioned: Partitioned | None


def program_model(call: StepCall, options: ModelOptions, traced: TracedProgram | None = None) -> ProgramModel:
    """The model of ``call.fn``'s program: traced, graphed, sized per device, given XLA's facts.

    Calibration (:func:`remat_opt.memory._calibrate.calibrate`) is the caller's next step, not
    done here: it needs the plain program's peak, which the baselines measure first, the
    planner measures inside its search (for unrolled scans, the flat program's), and the
    cache's restore never has (it compiles nothing).

    Args:
        call: the function, its arguments and what is differentiated (``argnums`` as
            ``jax.grad`` takes them); XLA's compiles are of its gradient step.
        options: how it is modelled.
        traced: ``call.fn`` already traced with ``options.unroll_scans`` (the caller's trace,
            not made twice); ``None``: traced here.

    Returns:
        The graph with its facts, XLA's plain program read or ``None``, the partitioning or ``None``.

    Raises:
        UnsupportedProgramError: the program holds an equation remat_opt cannot plan through.
        TypeError: an array leaf has a dtype JAX cannot trace.
    """
    if traced is None:
        nums = normalize_argnums(call.argnums, len(call.args))
        traced = trace(call.fn, call.args, call.kwargs, nums, options.unroll_scans)
    if options.body:  # a model written as one shard_map: its body is what is planned (program._manual)
        traced = planned_body(traced) or traced
    graph, partitioned = build_graph(traced, options.cost_model), None
    if options.interconnect is not None:  # on a mesh: one device's bytes, collectives priced (memory._sharded)
        graph, partitioned = sharded_graph(graph, call, options.interconnect)
    # XLA's account of the program: what no rule of the model knows, the gradients
    # it sums from partials held to the end, and each transpose's scratch.
    compiled = read_plain(call.fn, traced, call.args, call.kwargs, call.argnums, call.has_aux) \
        if options.xla_facts else None
    if compiled is None and options.warn_unknown:
        check_known(graph, stacklevel=4)  # reported at this function's caller's caller, as before it was here
    return ProgramModel(with_memory_facts(graph, compiled), compiled, partitioned)
