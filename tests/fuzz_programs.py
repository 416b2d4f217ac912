"""Small JAX programs no one wrote by hand: a hypothesis strategy, for tests and experiments.

A :class:`Program` is a straight-line list of :class:`Op` s over 2-D values
(``batch × width``), each op reading earlier values (so skips make a DAG, not
a chain): dots against a weight of its own, elementwise functions, reductions
broadcast back, reshapes and transposes, a softmax or layernorm block,
``lax.cond``, ``lax.scan`` over stacked weights with a random body,
``custom_jvp`` and ``custom_vjp`` functions, and an integer side input that is
never differentiated. The weights are a dict, a list or a NamedTuple; the
dtype is float32 or, for some programs, bfloat16. Dimensions stay in 4..32 so
that XLA compiles each in well under a second.

``repr(program)`` is the loss as Python source, so that a shrunk failure reads
as the program it is:

    >>> from hypothesis import find
    >>> print(find(programs(), lambda p: len(p.ops) >= 2))  # doctest: +SKIP
    def loss(params, x, k):  # params: dict w0 f32[8,8]; x f32[4,8]; k int32[]
        v1 = jnp.tanh(v0 @ params['w0'])
        ...

Use :func:`programs` in tests (``@given(programs())``) and :func:`draw_program`
in scripts (a seeded program without hypothesis' engine).
"""

from __future__ import annotations

import collections
import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

import remat_opt
from remat_opt.memory import model_graph
from remat_opt.memory import simulate
from remat_opt.program import trace
from remat_opt.solve import cut_candidates, save_candidates
from remat_opt.solve import SolverOptions, min_peak_schedule, solve

WIDTHS = (4, 8, 16)
BATCHES = (16, 32)  # activations larger than weights: remat has something to trade
KINDS = ("dot", "unary", "binary", "reduce", "reshape", "transpose", "softmax", "layernorm", "cond", "scan",
         "custom_jvp", "custom_vjp", "side")
UNARY = ("tanh", "sin", "exp_small", "square", "relu")
SCAN_BODIES = ("tanh_dot", "sin_dot_residual", "mul_gate")
CONTAINERS = ("dict", "list", "namedtuple")


# --- User-defined derivatives, as a model library would write them ---------------------

@jax.custom_jvp
def softplus(v):
    return jnp.logaddexp(v, 0.0)


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (v,), (t,) = primals, tangents
    return softplus(v), t * jax.nn.sigmoid(v)


@jax.custom_vjp
def soft_clip(v):
    return jnp.tanh(v) * 2.0


def _soft_clip_fwd(v):
    t = jnp.tanh(v)
    return t * 2.0, t  # the residual: what the backward pass reads


def _soft_clip_bwd(t, g):
    return (g * 2.0 * (1.0 - t * t),)


soft_clip.defvjp(_soft_clip_fwd, _soft_clip_bwd)


# --- The program ------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One line of a program: ``v{out} = kind(inputs...)``.

    Attributes:
        kind: one of :data:`KINDS`.
        inputs: indices of earlier values (``v0`` is ``x``).
        arg: what the kind needs besides: the unary function's name, the new
            width of a dot, the scan's body and length, the reduced axis.
        weight: the name of the weight this op owns (``""`` if none).
    """

    kind: str
    inputs: tuple[int, ...]
    arg: Any = None
    weight: str = ""


@dataclass(frozen=True)
class Program:
    """A loss ``fn(params, x, k)``: its ops, its weights' shapes, and how to build its arguments."""

    batch: int
    width: int  # x's width
    ops: tuple[Op, ...]
    weights: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: str = "float32"  # or "bfloat16"
    container: str = "dict"
    argnums: tuple[int, ...] = (0,)
    seed: int = 0
    tail: str = "square_skip"  # the loss: mean(last**2) + 0.1 mean(middle), or "sum": sum(last), one equation
    widths: tuple[int, ...] = field(default=(), compare=False)  # per value, its width (for repr)

    # -- arguments --

    def args(self) -> tuple[Any, Any, Any]:
        """``(params, x, k)``: weights scaled by 1/sqrt(fan-in), x in [-1, 1], k an int32 scalar."""
        rng = np.random.default_rng(self.seed)
        dtype = jnp.dtype(self.dtype)
        ws = [jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[-2]), dtype) for _, shape in self.weights]
        x = jnp.asarray(rng.uniform(-1, 1, (self.batch, self.width)), dtype)
        return self.pack(ws), x, jnp.int32(self.seed % 3)

    def pack(self, ws: list[Any]) -> Any:
        names = [n for n, _ in self.weights]
        if self.container == "list":
            return list(ws)
        if self.container == "namedtuple":
            return _params_type(tuple(names))(*ws)
        return dict(zip(names, ws))

    def weight(self, params: Any, name: str) -> Any:
        if self.container == "dict":
            return params[name]
        index = [n for n, _ in self.weights].index(name)
        return params[index]

    # -- the loss --

    def __call__(self, params: Any, x: Any, k: Any) -> Any:
        values = [x]
        for op in self.ops:
            values.append(self._apply(op, [values[i] for i in op.inputs], params, k))
        last = values[-1].astype(jnp.float32)
        if self.tail == "sum":
            return jnp.sum(last)
        skip = values[len(values) // 2].astype(jnp.float32)
        return jnp.mean(last * last) + 0.1 * jnp.mean(skip)

    def _apply(self, op: Op, ins: list[Any], params: Any, k: Any) -> Any:
        v = ins[0]
        w = self.weight(params, op.weight) if op.weight else None
        kind = op.kind
        if kind == "dot":
            return v @ w
        if kind == "unary":
            return _unary(op.arg, v)
        if kind == "binary":
            return v * ins[1] if op.arg == "mul" else v + ins[1]
        if kind == "reduce":
            return v - jnp.mean(v, axis=op.arg, keepdims=True) if op.arg == 1 else v * jnp.sum(v, axis=0)
        if kind == "reshape":
            b, d = v.shape
            return jnp.tanh(v.reshape(d, b)).reshape(b, d)
        if kind == "transpose":
            return jnp.sin(v.T).T * v
        if kind == "softmax":
            return jax.nn.softmax(v, axis=-1)
        if kind == "layernorm":
            mu = jnp.mean(v, axis=-1, keepdims=True)
            var = jnp.mean((v - mu) ** 2, axis=-1, keepdims=True)
            return (v - mu) * jax.lax.rsqrt(var + 1e-5)
        if kind == "cond":
            return jax.lax.cond(jnp.sum(v) > 0, jnp.tanh, lambda u: jnp.sin(u) * 0.5, v)
        if kind == "scan":
            return _scan(op.arg, v, w)
        if kind == "custom_jvp":
            return softplus(v)
        if kind == "custom_vjp":
            return soft_clip(v)
        if kind == "side":
            return jnp.where(k > 0, v, -v) * (k.astype(v.dtype) + 1)
        raise ValueError(f"unknown op kind {kind!r}")

    # -- the source, for a failure report --

    def __repr__(self) -> str:
        short = {"float32": "f32", "bfloat16": "bf16"}[self.dtype]
        shapes = ", ".join(f"{n} {short}[{','.join(map(str, s))}]" for n, s in self.weights)
        head = (f"def loss(params, x, k):  # params: {self.container} {shapes}; x {short}[{self.batch},"
                f"{self.width}]; k int32[] = {self.seed % 3}; argnums={self.argnums}; seed={self.seed}")
        lines = [head, "    v0 = x"]
        for i, op in enumerate(self.ops, 1):
            lines.append(f"    v{i} = {_source(op, self.container)}")
        n = len(self.ops)
        if self.tail == "sum":
            lines.append(f"    return sum(v{n}.astype(f32))")
        else:
            lines.append(f"    return mean(v{n}.astype(f32) ** 2) + 0.1 * mean(v{(n + 1) // 2}.astype(f32))")
        return "\n".join(lines)


_PARAMS_TYPES: dict[tuple[str, ...], type] = {}


def _params_type(names: tuple[str, ...]) -> type:
    """One NamedTuple class per field list, so equal programs build equal pytrees."""
    if names not in _PARAMS_TYPES:
        _PARAMS_TYPES[names] = collections.namedtuple("Params", names)
    return _PARAMS_TYPES[names]


def _unary(name: str, v: Any) -> Any:
    if name == "exp_small":
        return jnp.exp(0.5 * jnp.tanh(v))
    if name == "square":
        return v * v
    if name == "relu":
        return jax.nn.relu(v)
    return getattr(jnp, name)(v)


def _scan(body: str, v: Any, ws: Any) -> Any:
    def step(carry, w):
        if body == "tanh_dot":
            return jnp.tanh(carry @ w), None
        if body == "sin_dot_residual":
            return carry + jnp.sin(carry @ w) * 0.5, None
        return carry * jax.nn.sigmoid(carry @ w), None

    return jax.lax.scan(step, v, ws)[0]


_SOURCES = {
    "unary": lambda a, i, w: {"exp_small": f"exp(0.5 * tanh({i[0]}))", "square": f"{i[0]} * {i[0]}",
                              "relu": f"relu({i[0]})"}.get(a, f"{a}({i[0]})"),
    "binary": lambda a, i, w: f"{i[0]} {'*' if a == 'mul' else '+'} {i[1]}",
    "dot": lambda a, i, w: f"{i[0]} @ {w}",
    "reduce": lambda a, i, w: f"{i[0]} - mean({i[0]}, axis=1, keepdims=True)" if a == 1
    else f"{i[0]} * sum({i[0]}, axis=0)",
    "reshape": lambda a, i, w: f"tanh({i[0]}.reshape(d, b)).reshape(b, d)",
    "transpose": lambda a, i, w: f"sin({i[0]}.T).T * {i[0]}",
    "softmax": lambda a, i, w: f"softmax({i[0]}, axis=-1)",
    "layernorm": lambda a, i, w: f"layernorm({i[0]})",
    "cond": lambda a, i, w: f"lax.cond(sum({i[0]}) > 0, tanh, lambda u: sin(u) * 0.5, {i[0]})",
    "scan": lambda a, i, w: f"lax.scan({a}, {i[0]}, {w})[0]",
    "custom_jvp": lambda a, i, w: f"softplus({i[0]})  # custom_jvp",
    "custom_vjp": lambda a, i, w: f"soft_clip({i[0]})  # custom_vjp",
    "side": lambda a, i, w: f"where(k > 0, {i[0]}, -{i[0]}) * (k + 1)",
}


def _source(op: Op, container: str) -> str:
    ins = [f"v{i}" for i in op.inputs]
    w = ""
    if op.weight:
        w = f"params['{op.weight}']" if container == "dict" else f"params[{int(op.weight[1:])}]"
    return _SOURCES[op.kind](op.arg, ins, w)


# --- Drawing programs --------------------------------------------------------------------

def build(draw_int, draw_choice, max_ops: int = 6, tail: str = "square_skip") -> Program:
    """A program from two sources of choices (hypothesis' ``draw`` or a seeded ``random``).

    Args:
        draw_int: ``(lo, hi) -> int`` in ``[lo, hi]``.
        draw_choice: ``(sequence) -> element``.
        max_ops: the most ops; at least one.
        tail: the loss after the ops (see :attr:`Program.tail`).
    """
    batch, width = draw_choice(BATCHES), draw_choice(WIDTHS)
    n_ops = draw_int(1, max_ops)
    widths, ops, weights = [width], [], []
    for _ in range(n_ops):
        kind = draw_choice(KINDS)
        src = draw_int(max(0, len(widths) - 3), len(widths) - 1)  # recent values: chains with skips
        d = widths[src]
        name, arg, ins = "", None, (src,)
        if kind == "dot":
            arg = draw_choice(WIDTHS)
            name = f"w{len(weights)}"
            weights.append((name, (d, arg)))
            d = arg
        elif kind == "scan":
            length = draw_int(1, 3)
            arg = draw_choice(SCAN_BODIES)
            name = f"w{len(weights)}"
            weights.append((name, (length, d, d)))
        elif kind == "unary":
            arg = draw_choice(UNARY)
        elif kind == "binary":
            same = [i for i, w in enumerate(widths) if w == d]
            ins = (src, draw_choice(same))
            arg = draw_choice(("mul", "add"))
        elif kind == "reduce":
            arg = draw_choice((0, 1))
        widths.append(d)
        ops.append(Op(kind, ins, arg, name))
    if not weights:  # something to differentiate in params
        name = "w0"
        weights.append((name, (widths[-1], widths[-1])))
        ops.append(Op("dot", (len(widths) - 1,), widths[-1], name))
        widths.append(widths[-1])
    dtype = "bfloat16" if draw_int(0, 5) == 0 else "float32"
    argnums = (0, 1) if draw_int(0, 3) == 0 else (0,)
    return Program(batch, width, tuple(ops), tuple(weights), dtype, draw_choice(CONTAINERS), argnums,
                   draw_int(0, 2**16), tail, tuple(widths))


@st.composite
def programs(draw: Any, max_ops: int = 6, tail: str = "square_skip") -> Program:
    """A hypothesis strategy of :class:`Program` s with 1 to ``max_ops`` ops (shrinks towards fewer, simpler)."""
    return build(lambda lo, hi: draw(st.integers(lo, hi)), lambda seq: draw(st.sampled_from(seq)), max_ops, tail)


def draw_program(seed: int, max_ops: int = 6, tail: str = "square_skip") -> Program:
    """A program drawn with ``random.Random(seed)``: the same for the same seed, no hypothesis engine."""
    rng = random.Random(seed)
    return build(rng.randint, rng.choice, max_ops, tail)


budget_fractions = st.sampled_from((0.3, 0.5, 0.7, 0.85, 0.95, 1.0, 1.2))
"""Budgets as a fraction of the plain peak: below the lowest reachable to above the program as written."""


# --- The properties, checked on one program and budget ------------------------------------

TOLERANCES = {"float32": (1e-5, 1e-6), "bfloat16": (2e-2, 2e-2)}
"""``(rtol, atol)`` for gradients against ``jax.grad``, per weight or input, relative to its
largest entry: ``max |got - want| <= atol + rtol * max |want|``. Not entry by entry: an entry that
cancels to near zero carries the rounding of the large terms it summed, and XLA sums in another
order once it fuses otherwise. On generated program 31085 (jax 0.12.0.1) the jitted gradient of
the program as written differs from the eager one by 1.24x the entry-wise tolerance, and a plan's
by 1.67x: 1.1e-5 on an entry near 0 of a weight gradient whose largest entry is 85. bfloat16 keeps
8 bits of mantissa, and a checkpointed step recomputes its values in another order and fusion than
the plain one, so each re-rounded intermediate may differ in its last bit (2**-8 relative): looser
there, and only there."""

FAST_SOLVER = {"num_workers": 1, "deterministic_time_limit": 1.0, "time_limit_s": 60.0}
"""One worker (deterministic) and a short deterministic limit: the programs have a few dozen equations."""


@dataclass(frozen=True)
class Outcome:
    """What :func:`check` found for one program and budget.

    Attributes:
        outcome: ``"plan"`` (a plan fits), ``"infeasible"`` (InfeasibleBudgetError) or
            ``"exception"`` (anything else: a bug).
        budget: the budget, in bytes; ``plain_peak`` the program's peak as written.
        peak: XLA's peak of the optimized step, measured anew (plans), or the error's
            ``min_budget_bytes`` (infeasible).
        grad_error: largest ``max |got - want| / (atol + rtol max |want|)`` over the gradient's
            leaves (:data:`TOLERANCES`); at most 1 passes (for an
            infeasible budget, of the plan at ``min_budget_bytes``).
        deterministic: a second optimize (fresh, ``cache=False``) made the same plan or error.
        min_confirmed: for an infeasible budget, a plan at ``min_budget_bytes`` fits on XLA
            (its step's peak measured anew).
        detail: the plan's one-line decision, or the exception.
    """

    outcome: str
    budget: int
    plain_peak: int
    peak: int = 0
    grad_error: float = 0.0
    deterministic: bool = True
    min_confirmed: bool = True
    detail: str = ""

    @property
    def ok(self) -> bool:
        fits = self.peak <= self.budget if self.outcome == "plan" else self.min_confirmed
        return self.outcome != "exception" and fits and self.grad_error <= 1.0 and self.deterministic


def _grad_error(got: Any, want: Any, dtype: str) -> float:
    rtol, atol = TOLERANCES[dtype]
    errors = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        errors.append(np.max(np.abs(a - b), initial=0.0) / (atol + rtol * np.max(np.abs(b), initial=0.0)))
    return float(max(errors, default=0.0))


def _decision(plan: Any) -> tuple:
    """What two runs must agree on: the schedule (or loop plan) and XLA's figures."""
    return (plan.schedule, plan.loop_plan, plan.measured_peak_bytes, plan.measured_recompute_flops)


def _measured(step: Any, program: Program, args: tuple) -> tuple[int, float]:
    """XLA's peak of the optimized step, measured here (not read from its plan), and its gradients'
    error against ``jax.grad`` of the program as written."""
    nums = program.argnums
    peak = remat_opt.peak_bytes(step, *args, argnums=nums)
    got, want = jax.grad(step, argnums=nums)(*args), jax.grad(program, argnums=nums)(*args)
    return peak, _grad_error(got, want, program.dtype)


def check(program: Program, fraction: float) -> Outcome:
    """Optimizes ``program`` under ``fraction`` of its plain peak and checks every property.

    Plans: XLA's peak of the optimized step is within the budget, gradients equal ``jax.grad``'s,
    a second run plans the same. Infeasible budgets: a second run raises the same, and the plan at
    the error's ``min_budget_bytes`` fits it (XLA's peak, measured anew) with the right gradients:
    the tightest plan there is, where checkpoints are most likely. Any other exception is
    returned as the ``"exception"`` outcome.
    """
    args, nums = program.args(), program.argnums
    plain = remat_opt.peak_bytes(program, *args, argnums=nums)
    budget = max(1, int(plain * fraction))
    options = remat_opt.SolverOptions(**FAST_SOLVER)

    def attempt(b: int) -> Any:
        step = remat_opt.optimize(program, b, argnums=nums, cache=False, solver_options=options)
        try:
            return step, step.plan(*args)
        except remat_opt.InfeasibleBudgetError as err:
            return step, err

    try:
        step, first = attempt(budget)
        _, second = attempt(budget)
        if isinstance(first, remat_opt.InfeasibleBudgetError):
            same = isinstance(second, remat_opt.InfeasibleBudgetError) and (
                second.min_budget_bytes, second.schedule) == (first.min_budget_bytes, first.schedule)
            least = first.min_budget_bytes
            if first.lower_bound:  # the step's arguments and outputs, no confirmed budget: the search's is above
                _, searched = attempt(least)
                least = searched.min_budget_bytes if isinstance(searched, remat_opt.InfeasibleBudgetError) else least
            step, at_min = attempt(least)
            if isinstance(at_min, Exception):
                return Outcome("infeasible", budget, plain, least, 0.0, same, False, f"at the minimum: {at_min}")
            peak, error = _measured(step, program, args)
            return Outcome("infeasible", budget, plain, least, error, same, peak <= least,
                           f"plan at the minimum ({peak} bytes): {_describe_plan(at_min)}")
        same = not isinstance(second, Exception) and _decision(second) == _decision(first)
        peak, error = _measured(step, program, args)
        return Outcome("plan", budget, plain, peak, error, same, True, _describe_plan(first))
    except Exception as err:  # noqa: BLE001 - the fuzzer's finding: reported, with its program
        return Outcome("exception", budget, plain, detail=f"{type(err).__name__}: {err}"[:500])


def _describe_plan(plan: Any) -> str:
    return f"{plan.schedule}" if plan.loop_plan is None else f"{plan.loop_plan}"


# --- CP-SAT against exhaustive search ---------------------------------------------------

MAX_CANDIDATES = 12
"""Cut and save candidates together, at most, for brute force: 2**12 schedules, about a second."""


def brute_force_agrees(graph) -> bool | None:
    """Whether CP-SAT's optimum equals exhaustive search's at several budgets and for the
    lowest peak; ``None`` when the graph is too large to enumerate (over 12 positions, or
    over 2**MAX_CANDIDATES schedules)."""
    if graph.num_positions > 12 or len(cut_candidates(graph, 64)) + len(save_candidates(graph)) > MAX_CANDIDATES:
        return None
    from test_solve import _all_schedules  # the enumeration tests/test_solve.py brute-forces with

    sims = [simulate(graph, s, planning=True) for s in _all_schedules(graph)]
    peaks = sorted({s.peak_bytes for s in sims})
    options = SolverOptions(**{**FAST_SOLVER, "deterministic_time_limit": 10.0})
    if simulate(graph, min_peak_schedule(graph, options), planning=True).peak_bytes != peaks[0]:
        return False
    for budget in peaks[:: max(1, len(peaks) // 4)] + [peaks[-1]]:
        best = min(s.recompute_flops for s in sims if s.peak_bytes <= budget)
        solution = solve(graph, budget, options)
        checked = simulate(graph, solution.schedule, planning=True)
        if solution.status != "OPTIMAL" or checked.peak_bytes > budget or checked.recompute_flops != best:
            return False
    return True


def graph_of(program: Program, scale: float = 1.0):
    args = program.args()
    graph = model_graph(trace(program, args, {}, program.argnums))
    return dataclasses.replace(graph, plain_storage_scale=scale)
