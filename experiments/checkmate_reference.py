"""Reference solver: Checkmate's MILP on remat_opt's graphs, for optimality and solve time.

Checkmate schedules ``n`` topologically ordered operations in ``n`` stages;
stage ``t`` computes operation ``t`` and may recompute earlier ones. Binary
``R[t,i]`` (computed in stage ``t``), ``S[t,i]`` (held entering stage ``t``),
``Free[t,(i,k)]`` (``i`` freed once its reader ``k`` ran in stage ``t``) and
continuous ``U[t,k]`` (bytes held after ``k`` in stage ``t``) <= budget;
objective ``sum R[t,i] cost[i]``. Only the lower triangle is built: O(n²)
binaries, where :mod:`remat_opt.solve._encoding` needs O(n). Solved by an open MILP
solver bundled with OR-tools (SCIP by default; CBC or HiGHS). A reference,
not a planner: plans are checked by :func:`simulate_stages` (the rules
evaluated directly on ``R`` and ``S``), *not* rewritten into JAX. It lives
beside the experiments, outside the installed package: tests/test_checkmate.py
and the solve-time experiments import it from here.

:func:`from_program_graph` builds Checkmate's graph from a
:class:`~remat_opt.program._graph.ProgramGraph`, approximately:

* Forward operations: the known-program units owning a buffer. Aliases
  (``name``, reshapes) fold into the unit whose buffer they share; residuals
  XLA fuses into the backward (``graph.fused``) are dropped, their readers read
  the fused value's inputs. All else is materialized (no forward fusion).
* Backward operations: one per *active* primal equation (it reads a value
  that depends on a differentiated input; from the traced jaxpr). It writes
  the cotangents of its active non-input operands, reads those of its outputs,
  and costs twice the forward FLOPs.
* The backward of equation ``p`` reads every residual made at ``p`` or read
  by a forward unit at ``p`` (a ``dot``'s operands); the linear program is not
  consulted, so a residual may be needed earlier and held longer than it is.
* Inputs, primal outputs and gradients are a constant ``base_bytes``; in-flight
  transients and in-place reuse are not modelled. Derived units (``1 - tanh²``)
  cost 0, as in :func:`remat_opt.memory._simulate.simulate`.

References:
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
    Rematerialization", MLSys 2020 (parasj/checkmate, ``gurobi_solver.py``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import jax.numpy as jnp
from jax.extend import core
from ortools.linear_solver import pywraplp

from remat_opt.program._graph import ProgramGraph, aval_bytes

BACKENDS = ("SCIP", "CBC", "HIGHS")
Ops = frozenset[int]
Stages = tuple[frozenset[int], ...]  # one set of operations per stage
_STATUS = {pywraplp.Solver.OPTIMAL: "OPTIMAL", pywraplp.Solver.FEASIBLE: "FEASIBLE",  # 99: HiGHS
           pywraplp.Solver.INFEASIBLE: "INFEASIBLE", pywraplp.Solver.NOT_SOLVED: "UNKNOWN", 99: "UNKNOWN"}


@dataclass(frozen=True)
class CheckmateGraph:
    """Operations in topological order with their cost, output bytes and reads.

    Attributes:
        labels, cost, memory: per operation a name (``"f5:dot_general"``,
            ``"b2:tanh"``), the cost of one run, and the bytes of its output.
        edges: ``(u, v)`` pairs with ``u < v``: ``v`` reads ``u``'s output.
        base_bytes: bytes held throughout, outside the operations.
        num_forward: operations ``0..num_forward-1`` are the forward.
    """

    labels: tuple[str, ...]
    cost: tuple[int, ...]
    memory: tuple[int, ...]
    edges: tuple[tuple[int, int], ...]
    base_bytes: int = 0
    num_forward: int = 0
    preds: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    succs: tuple[tuple[int, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n, bad = len(self.cost), [e for e in self.edges if not 0 <= e[0] < e[1] < len(self.cost)]
        if len(self.memory) != n or len(self.labels) != n or bad:
            raise ValueError(f"labels, cost, memory need one entry per operation (got "
                             f"{len(self.labels)}, {n}, {len(self.memory)}) and edges "
                             f"0 <= u < v < {n}, in topological order; got {bad[:3]}.")
        preds: list[list[int]] = [[] for _ in range(n)]
        succs: list[list[int]] = [[] for _ in range(n)]
        for u, v in sorted(set(self.edges)):
            preds[v].append(u)
            succs[u].append(v)
        object.__setattr__(self, "preds", tuple(map(tuple, preds)))
        object.__setattr__(self, "succs", tuple(map(tuple, succs)))

    @property
    def size(self) -> int:
        return len(self.cost)

    def num_variables(self) -> int:
        """Variables of the MILP (R, S, U and Free), counted without building it."""
        n = self.size
        return n * (n + 1) + n * (n - 1) // 2 + sum((n - 1 - k) * len(ps) for k, ps in enumerate(self.preds))


@dataclass(frozen=True)
class CheckmateSolution:
    """The MILP's verdict: a measurement record, so "no solution" is a status, not an error.

    Attributes:
        status: ``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE`` or ``UNKNOWN`` (none in time).
        recompute_cost: cost beyond one run of every operation (NaN without a solution).
        bound_cost: the solver's lower bound on ``recompute_cost``.
        gap: ``(recompute_cost - bound_cost) / recompute_cost``; 0 when optimal.
        solve_seconds, build_seconds: wall time of the solver call and of building the model.
        num_variables, num_constraints: size of the model.
        compute, keep: per stage ``t``, ``R[t]`` (computed) and ``S[t]`` (held entering it).
    """

    status: str
    recompute_cost: float
    bound_cost: float
    gap: float
    solve_seconds: float
    build_seconds: float
    num_variables: int = 0
    num_constraints: int = 0
    compute: Stages = ()
    keep: Stages = ()

    @property
    def feasible(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE")


def from_program_graph(graph: ProgramGraph) -> CheckmateGraph:
    """Checkmate's forward + backward graph of ``graph`` (see the module docstring)."""
    units = graph.units
    out_buffers = {graph.buffer[v] for v in range(graph.num_nodes) if graph.is_output[v]}

    def owned(v: int) -> bool:  # a buffer of its own that XLA materializes
        return graph.buffer[v] == v and not (graph.fused and graph.fused[v])
    fwd = [u for u in units if any(owned(v) for v in u.outputs)]
    op_of = {u.index: i for i, u in enumerate(fwd)}
    memo: dict[int, frozenset[int]] = {}

    def src(v: int) -> frozenset[int]:
        b = graph.buffer[v]  # the operations whose outputs a reader of node v needs
        if b < 0:
            return frozenset()
        if b not in memo:
            unit = units[graph.node_unit[b]]
            memo[b] = (frozenset({op_of[unit.index]}) if owned(b)
                       else frozenset().union(*(src(w) for w in unit.inputs)))
        return memo[b]

    labels = [f"f{u.index}:{u.primitive}" for u in fwd]
    cost = [u.flops if u.index in graph.primal else 0 for u in fwd]
    memory = [sum(graph.node_bytes[v] for v in u.outputs if owned(v) and v not in out_buffers)
              for u in fwd]
    edges = {(s, op_of[u.index]) for u in fwd for w in u.inputs for s in src(w) if s != op_of[u.index]}

    # The backward, from JAX-style activity analysis of the primal program.
    jaxpr = graph.traced.jaxpr.jaxpr
    active = {v for v, d in zip(jaxpr.invars, graph.traced.differentiable) if d}
    made_at: dict[core.Var, int] = {}
    active_positions: list[int] = []
    for p, eqn in enumerate(jaxpr.eqns):
        reads = [x for x in eqn.invars if isinstance(x, core.Var) and x in active]
        outs = [o for o in eqn.outvars
                if jnp.issubdtype(getattr(o.aval, "dtype", jnp.int32), jnp.inexact)]
        if reads and outs:
            active.update(outs)
            active_positions.append(p)
        made_at.update((o, p) for o in eqn.outvars)
    back = {p: len(fwd) + r for r, p in enumerate(reversed(active_positions))}
    flops_at: Counter[int] = Counter()
    for u in units:
        flops_at[u.position] += u.flops if u.index in graph.primal else 0
    for p in reversed(active_positions):
        eqn = jaxpr.eqns[p]
        operands = {x for x in eqn.invars if isinstance(x, core.Var) and x in active and x in made_at}
        labels.append(f"b{p}:{eqn.primitive.name}")
        cost.append(2 * flops_at[p])
        memory.append(sum(aval_bytes(x.aval) for x in operands))
        edges.update((back[p], back[made_at[x]]) for x in operands)
    for v in (v for v in range(graph.num_nodes) if graph.residual[v]):
        readers = {graph.position_of(v)} | {units[c].position for c in graph.consumers[v]}
        edges.update((s, back[q]) for q in readers if q in back for s in src(v))
    return CheckmateGraph(tuple(labels), tuple(cost), tuple(memory), tuple(sorted(edges)),
                          graph.input_bytes + graph.output_bytes, len(fwd))


def stage_peak(cg: CheckmateGraph, t: int, compute: Ops, keep: Ops, keep_next: Ops) -> int:
    """Checkmate's largest ``U[t, k]`` over ``k`` in stage ``t``; ValueError if a rule is broken."""
    missing = {u for v in compute for u in cg.preds[v]} - keep - compute
    if t not in compute or max(compute) > t or any(i >= t for i in keep) or missing:
        raise ValueError(f"stage {t} must compute {t}, only operations <= {t} and their inputs "
                         f"(missing {sorted(missing)}), and keep only outputs < {t}.")
    if not keep_next <= keep | compute:
        raise ValueError(f"stage {t + 1} keeps {sorted(keep_next - keep - compute)}, never computed.")
    held = peak = sum(cg.memory[i] for i in keep) + (cg.memory[0] if 0 in compute else 0)
    for k in range(1, t + 1):  # free the inputs of k - 1 whose last reader here it was; run k
        held -= sum(cg.memory[i] for i in cg.preds[k - 1] if k - 1 in compute and i not in keep_next
                    and not any(j in compute for j in cg.succs[i] if j > k - 1))
        held += cg.memory[k] if k in compute else 0
        peak = max(peak, held)
    return peak


def simulate_stages(cg: CheckmateGraph, compute: Stages, keep: Stages) -> tuple[int, int]:
    """Peak bytes (with ``base_bytes``) and recompute cost of a schedule ``R``, ``S``."""
    if len(compute) != (n := cg.size) or len(keep) != n:
        raise ValueError(f"compute and keep need {n} stages each; got {len(compute)} and {len(keep)}.")
    peak = max(stage_peak(cg, t, compute[t], keep[t], keep[t + 1] if t + 1 < n else frozenset())
               for t in range(n))
    return cg.base_bytes + peak, sum(cg.cost[i] for r in compute for i in r) - sum(cg.cost)


def store_all(cg: CheckmateGraph) -> tuple[Stages, Stages]:
    """The schedule without recomputation: every output held until its last reader."""
    last = [max(cg.succs[i], default=i) for i in range(cg.size)]
    return (tuple(frozenset({t}) for t in range(cg.size)),
            tuple(frozenset(i for i in range(t) if last[i] >= t) for t in range(cg.size)))


def solve_checkmate(cg: CheckmateGraph, budget_bytes: int, *, time_limit_s: float = 60.0,
                    backend: str = "SCIP", num_threads: int = 1, seed: int = 0) -> CheckmateSolution:
    """Minimum-cost Checkmate schedule (``R[t,t] = 1``: every operation runs) fitting the budget.

    Args:
        cg: the graph.
        budget_bytes: the peak to fit, including ``cg.base_bytes``.
        time_limit_s: wall-clock cap of the solver call.
        backend: a MILP solver of OR-tools' ``pywraplp``, one of :data:`BACKENDS`.
        num_threads: solver threads (SCIP ignores more than one).
        seed: random seed (SCIP only).

    Returns:
        The solution; ``status`` says whether it is optimal, feasible, infeasible or unknown.

    Raises:
        ValueError: ``backend`` is not available or ``time_limit_s`` is not positive.

    Example:
        >>> cg = CheckmateGraph(("a", "b", "c"), (4, 4, 0), (8, 8, 8), ((0, 1), (1, 2), (0, 2)))
        >>> solve_checkmate(cg, 24, time_limit_s=5).recompute_cost
        0.0
    """
    solver = pywraplp.Solver.CreateSolver(backend) if backend in BACKENDS else None
    if solver is None:
        raise ValueError(f"backend must be one of {BACKENDS} bundled with OR-tools; got {backend!r}.")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be positive; got {time_limit_s!r}.")
    start, cap = time.perf_counter(), budget_bytes - cg.base_bytes
    if cap < 0:
        return CheckmateSolution("INFEASIBLE", math.nan, math.nan, math.nan, 0.0, 0.0)
    scale = math.gcd(*cg.cost) or 1  # gcd scaling, as Checkmate does
    R, S, objective = _milp(solver, cg, cap, scale)
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    solver.SetNumThreads(num_threads)
    solver.SuppressOutput()
    if backend == "SCIP":
        solver.SetSolverSpecificParametersAsString(f"randomization/randomseedshift = {seed}\n")
    built = time.perf_counter()
    code, solved = solver.Solve(), time.perf_counter()
    status = _STATUS.get(code, f"ABNORMAL({code})")
    record = (solved - built, built - start, solver.NumVariables(), solver.NumConstraints())
    if status not in ("OPTIMAL", "FEASIBLE"):
        return CheckmateSolution(status, math.nan, math.nan, math.nan, *record)
    compute = tuple(frozenset(i for i, x in enumerate(r) if x.solution_value() > 0.5) for r in R)
    keep = tuple(frozenset(i for i, x in enumerate(r) if x.solution_value() > 0.5) for r in S)
    recompute = float(sum(cg.cost[i] for r in compute for i in r) - sum(cg.cost))
    bound = min(recompute, max(0.0, objective.BestBound() * scale - sum(cg.cost)))
    gap = 0.0 if status == "OPTIMAL" or recompute == 0 else (recompute - bound) / recompute
    return CheckmateSolution(status, recompute, bound, gap, *record, compute=compute, keep=keep)


def _milp(solver: pywraplp.Solver, cg: CheckmateGraph, cap: int, scale: int
          ) -> tuple[list, list, pywraplp.Objective]:
    """Checkmate's MILP in ``solver``: the compute (``R``) and keep (``S``) variables,
    each stage's memory under ``cap``, and the objective (costs over ``scale``)."""
    n, m = cg.size, cg.memory
    unit = math.gcd(*m) or 1
    R = [[solver.IntVar(int(i == t), 1, f"R{t}_{i}") for i in range(t + 1)] for t in range(n)]
    S = [[solver.BoolVar(f"S{t}_{i}") for i in range(t)] for t in range(n)]
    U = [[solver.NumVar(0, cap // unit, f"U{t}_{k}") for k in range(t + 1)] for t in range(n)]

    def row(lo: float, hi: float, *terms: tuple) -> None:
        c = solver.Constraint(lo, hi)
        for var, coef in terms:
            c.SetCoefficient(var, coef)

    inf, objective = solver.infinity(), solver.Objective()
    for t in range(n):
        for i in range(t + 1):
            objective.SetCoefficient(R[t][i], cg.cost[i] / scale)
        nxt = S[t + 1] if t + 1 < n else None
        if nxt is not None:
            for i in range(t + 1):  # S[t+1,i] <= S[t,i] + R[t,i]
                row(-inf, 0, (nxt[i], 1), (R[t][i], -1), *([(S[t][i], -1)] if i < t else []))
        for v in range(t + 1):  # R[t,v] <= R[t,u] + S[t,u]
            for u in cg.preds[v]:
                row(-inf, 0, (R[t][v], 1), (R[t][u], -1), (S[t][u], -1))
        row(0, 0, (U[t][0], 1), (R[t][0], -m[0] / unit), *((S[t][i], -m[i] / unit) for i in range(t)))
        for k in range(t):  # U[t,k+1] = U[t,k] + m[k+1] R[t,k+1] - frees of k's inputs
            frees = []
            for i in cg.preds[k]:
                later = [(R[t][j], 1) for j in cg.succs[i] if k < j <= t]
                hazards = [(R[t][k], -1), *later, *([(nxt[i], 1)] if nxt is not None else [])]  # + 1
                free = solver.BoolVar(f"F{t}_{i}_{k}")
                row(0, inf, (free, 1), *hazards)  # 1 - F <= hazards, and w (1 - F) >= hazards:
                w = len(hazards)
                row(1 - w, inf, (free, -w), *((x, -c) for x, c in hazards))
                frees.append((free, m[i] / unit))
            row(0, 0, (U[t][k + 1], 1), (U[t][k], -1), (R[t][k + 1], -m[k + 1] / unit), *frees)
    objective.SetMinimization()
    return R, S, objective
