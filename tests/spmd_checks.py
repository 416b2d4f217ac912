"""Sharded programs on 8 simulated CPU devices, run in a process of their own.

jax must see 8 devices from its start (``XLA_FLAGS=--xla_force_host_platform_device_count=8``),
so ``tests/test_spmd.py`` runs this script in a subprocess and checks what it prints: one JSON
object per case, with XLA's per-device peaks, the gradients' error against the unsharded
``jax.grad``, and the fenced per-layer policies measured the same way.

The model: the zoo MLP on a 2×4 mesh, sharded three ways with JAX's own SPMD partitioner
(``jax.jit`` over ``NamedSharding`` arguments):

- ``dp``: data parallel, the batch over all 8 devices, the parameters replicated (and
  ``dp_explicit``, the same on a mesh of ``Explicit`` axes);
- ``fsdp``: the batch and every weight's rows over all 8 devices, each layer gathering its
  weights (``with_sharding_constraint`` to replicated, inside the layer, as Flax and MaxText
  gather them): a gathered weight is a value the plan saves or gathers again;
- ``dp_tp``: the batch over ``data`` (2), the weights over ``model`` (4), Megatron-style
  (a column-parallel layer, then a row-parallel one);

and two ``shard_map`` programs:

- ``shard_map``: each layer a ``shard_map`` written per device, row-parallel over ``model``
  (the features and the weight's rows split, the partial products summed with ``psum``), the
  batch over ``data``. The planner sees each ``shard_map`` as one unit, as it sees a
  ``custom_vjp``: checkpoints fall between them, not inside;
- ``shard_map_body``: a model of Megatron MLP blocks (hidden 4× the width) in one ``shard_map``,
  written per device (each block's first weight split by columns over ``model``, its second by
  rows, the partial products summed with ``psum``; the batch over ``data``), the loss outside.
  Its body is planned inside, per device (``remat_opt.program._manual``); the fenced per-block
  policies wrap the blocks inside the body. ``shard_map_body_explicit``: the same on a mesh of
  ``Explicit`` axes (``jax.make_mesh``'s default in recent JAX), where the shardings are part of
  the arguments' types, so every trace of the program carries them.

Usage: ``python tests/spmd_checks.py [case ...]``.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

try:  # jax >= 0.7
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

import remat_opt
from remat_opt.cache import list_entries
from remat_opt.baselines import BaselineCall, policy_plan, reference
from remat_opt.memory import traced_step
from remat_opt.memory._sharded import collective_bytes
from remat_opt.program._traced_layout import traced_layout
from remat_opt.rewrite import layer_policy_program
from remat_opt.zoo import mlp

CONFIG = mlp.MLPConfig(depth=4, width=256, batch=1024)
BUDGET_SHARES = {"dp": (0.85,), "fsdp": (0.85,), "dp_tp": (0.97,), "shard_map": (0.9,), "dp_explicit": (0.85,),
                 "shard_map_body": (0.8, 0.65), "shard_map_body_explicit": (0.8,)}
"""Budgets per case, as shares of the plain per-device peak (the experiment sweeps more). Tensor
parallelism leaves less to remat: its lowest reachable peak on this MLP is about 0.96."""
POLICIES = ("nothing_saveable", "dots_saveable")
SOLVER = remat_opt.SolverOptions(deterministic_time_limit=0.5, num_workers=2)


def mesh(case: str = "") -> jax.sharding.Mesh:
    """The 2×4 mesh: ``Auto`` axes (XLA propagates shardings), or for ``*_explicit`` cases
    ``jax.make_mesh``'s own default in recent JAX, ``Explicit`` (shardings in the types)."""
    kind = jax.sharding.AxisType.Explicit if case.endswith("_explicit") else jax.sharding.AxisType.Auto
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)


def shard_map_layer(m: jax.sharding.Mesh):
    """One MLP layer as a row-parallel ``shard_map``: ``tanh(psum(x_shard @ w_rows) + b)``."""
    def per_device(p, x):
        return jnp.tanh(jax.lax.psum(x @ p["w"], "model") + p["b"])

    specs = ({"w": P("model", None), "b": P()}, P("data", "model"))
    return shard_map(per_device, mesh=m, in_specs=specs, out_specs=P("data", None))


def megatron_block(p, x):
    """A Megatron MLP block, per device: ``x + psum(gelu(x @ w1_cols + b1_cols) @ w2_rows)``."""
    return x + jax.lax.psum(jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"], "model")


BLOCK_SPECS = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}


def init_blocks(key: jax.Array) -> tuple:
    """``CONFIG.depth`` blocks of width ``CONFIG.width`` (hidden 4×), and a batch, as ``mlp.init`` lays them out."""
    d, depth = CONFIG.width, CONFIG.depth
    k = jax.random.split(key, 2 * depth + 2)
    layers = [{"w1": jax.random.normal(k[2 * i], (d, 4 * d)) / d ** 0.5, "b1": jnp.zeros(4 * d),
               "w2": jax.random.normal(k[2 * i + 1], (4 * d, d)) / (8 * d ** 0.5)} for i in range(depth)]
    batch = {"x": jax.random.normal(k[-2], (CONFIG.batch, d)), "y": jax.random.normal(k[-1], (CONFIG.batch, d))}
    return {"layers": layers}, batch


def init(case: str) -> tuple:
    """The parameters and batch of a case: Megatron blocks for ``shard_map_body``, else the zoo MLP's."""
    key = jax.random.key(0)
    return init_blocks(key) if case.startswith("shard_map_body") else mlp.init(CONFIG, key)


def shard_map_model(m: jax.sharding.Mesh, wrap):
    """A model of Megatron blocks in one ``shard_map``, per device, each block wrapped in ``wrap``."""
    def per_device(params, x):
        for p in params["layers"]:
            x = wrap(megatron_block)(p, x)
        return x

    specs = ({"layers": [BLOCK_SPECS] * CONFIG.depth}, P("data"))
    return shard_map(per_device, mesh=m, in_specs=specs, out_specs=P("data"))


def make_loss(case: str, m: jax.sharding.Mesh):
    """The loss of a case, taking the zoo's ``layer_wrapper`` (for the per-layer policies)."""
    replicated = NamedSharding(m, P())
    sharded_layer = shard_map_layer(m)

    def gathered(layer):  # FSDP: the layer's weights all-gathered where the layer runs
        return lambda p, x: layer(jax.tree.map(lambda w: jax.lax.with_sharding_constraint(w, replicated), p), x)

    def loss(params, batch, layer_wrapper=None):
        wrap = layer_wrapper or (lambda f: f)
        if case == "fsdp":
            return mlp.loss(params, batch, layer_wrapper=lambda f: wrap(gathered(f)))
        if case == "shard_map":  # the zoo's layer, written per device
            return mlp.loss(params, batch, layer_wrapper=lambda f: wrap(sharded_layer))
        if case.startswith("shard_map_body"):  # the zoo's model, written per device
            return jnp.mean(jnp.square(shard_map_model(m, wrap)(params, batch["x"]) - batch["y"]))
        return mlp.loss(params, batch, layer_wrapper=layer_wrapper)

    return loss


def layouts(case: str, params) -> tuple:
    """Partition specs of the parameters and of the batch."""
    layers = params["layers"]
    if case in ("dp", "dp_explicit"):
        return jax.tree.map(lambda _: P(), params), P(("data", "model"))
    if case == "fsdp":
        return {"layers": [{"w": P(("data", "model"), None), "b": P()} for _ in layers]}, P(("data", "model"))
    if case == "shard_map":
        return {"layers": [{"w": P("model", None), "b": P()} for _ in layers]}, P("data")
    if case.startswith("shard_map_body"):
        return {"layers": [BLOCK_SPECS] * len(layers)}, P("data")
    column, row = {"w": P(None, "model"), "b": P("model")}, {"w": P("model", None), "b": P()}
    return {"layers": [column if i % 2 == 0 else row for i in range(len(layers))]}, P("data")


def relative_error(got, want) -> float:
    """The largest gradient error, each leaf's relative to its largest entry."""
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))) / (np.max(np.abs(np.asarray(w))) or 1.0))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def baselines(loss, args, budget: int) -> dict:
    """The fenced per-layer policies (the per-layer plans XLA does not undo), measured as the plan is,
    with the collective bytes XLA's compiled step moves per device (a collective the policy
    recomputes moves again)."""
    ref = reference(BaselineCall(loss, args, budget_bytes=budget))
    out = {}
    for policy in POLICIES:
        program = layer_policy_program(loss, policy, fenced=True)
        plan = policy_plan(ref, f"fenced_layer_checkpoint/{policy}", program)
        moved = collective_bytes(traced_step(program, args, {}, 0, False).lower().compile().as_text())
        out[policy] = {"peak": plan.measured_peak_bytes, "flops": plan.measured_recompute_flops,
                       "collective_bytes": moved}
    return out


def gathers(plan: remat_opt.Plan) -> list[dict]:
    """Per collective equation (an FSDP layer's gather), the plan's decision on its value."""
    return [{"primitive": c.primitive, "bytes": c.bytes, "kinds": list(c.kinds), "decision": c.decision}
            for c in plan.collectives]


def run_case(case: str) -> dict:
    started = time.perf_counter()
    m = mesh(case)
    params, batch = init(case)
    loss = make_loss(case, m)
    pspec, bspec = layouts(case, params)
    args = (jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(m, s)), params, pspec),
            jax.tree.map(lambda a: jax.device_put(a, NamedSharding(m, bspec)), batch))
    plain = remat_opt.peak_bytes(loss, *args)
    # Unsharded, on one device; a shard_map on Explicit axes takes only arguments laid out as its
    # specs say, so there the reference is the plain program's own gradient on the mesh.
    unsharded = (params, batch) if case != "shard_map_body_explicit" else args
    want = jax.jit(jax.grad(loss))(*unsharded)
    # fsdp's plan is kept in a plan cache of its own, which cached() then loads from.
    with tempfile.TemporaryDirectory(prefix="remat_opt_spmd_") as folder:
        results = [budget_result(case, loss, args, want, int(plain * share), folder)
                   for share in BUDGET_SHARES.get(case, (0.85,))]
    return {"case": case, "plain": plain, "global_plain": remat_opt.peak_bytes(loss, *unsharded),
            "results": results, "refusal": refusal(loss, args, plain) if case == "dp" else None,
            "seconds": time.perf_counter() - started}


def budget_result(case: str, loss, args, want, budget: int, folder: str) -> dict:
    """remat_opt's plan of ``case`` at ``budget`` (or, below reach, at the budget the error
    names), checked against XLA, the gradients ``want`` and the baselines."""
    refused = None
    try:
        step = remat_opt.optimize(loss, budget, cache=folder if case == "fsdp" else False, solver_options=SOLVER)
        plan = step.plan(*args)
    except remat_opt.InfeasibleBudgetError as err:  # below reach: the budget the error names
        refused, budget = budget, err.min_budget_bytes
        step = remat_opt.optimize(loss, budget, cache=False, solver_options=SOLVER)
        plan = step.plan(*args)
    got = jax.jit(jax.grad(step))(*args)
    return {
        "budget": budget, "refused": refused, "measured": plan.measured_peak_bytes, "predicted": plan.predicted_peak_bytes,
        "recompute_flops": plan.measured_recompute_flops, "status": plan.status,
        "collective_bytes": plan.collective_bytes, "plain_collective_bytes": plan.plain_collective_bytes,
        "flops_per_byte": plan.collective_flops_per_byte,
        "remeasured": remat_opt.peak_bytes(step, *args), "grad_error": relative_error(got, want),
        # (dp_explicit's policies are dp's: not measured twice)
        "baselines": baselines(loss, args, budget) if case != "dp_explicit" else {}, "gathers": gathers(plan), "report": str(plan),
        "cached": cached(loss, args, budget, plan, folder) if case == "fsdp" else None,
        "under_jit": under_jit(loss, args, budget, plan) if case in UNDER_JIT else None,
    }


UNDER_JIT = ("dp", "fsdp", "dp_tp", "dp_explicit")
"""Cases also planned first under ``jax.jit``, on tracers, as the README calls the step."""


def count_compiles(run) -> tuple:
    """``run()`` and the XLA compiles it made."""
    compiles = []
    compile_ = jax.stages.Lowered.compile
    jax.stages.Lowered.compile = lambda self, *a, **k: compiles.append(1) or compile_(self, *a, **k)
    try:
        return run(), len(compiles)
    finally:
        jax.stages.Lowered.compile = compile_


def under_jit(loss, args, budget: int, made: remat_opt.Plan) -> dict:
    """A fresh ``optimize`` planned inside ``jax.jit(jax.value_and_grad(step)).lower(*args)``
    (the arguments are tracers), then asked for ``plan(*args)`` on the arrays: the plan made under
    ``jit`` must be the one ``plan()`` makes (``made``), found without compiling anything."""
    step = remat_opt.optimize(loss, budget, cache=False, solver_options=SOLVER)
    try:
        jax.jit(jax.value_and_grad(step)).lower(*args)
    except remat_opt.InfeasibleBudgetError as err:
        return {"error": str(err), "compiles": None, "same": False}
    plan, compiles = count_compiles(lambda: step.plan(*args))
    # Inside a jit of more arguments, in another order, the tracers still find their arrays' layout.
    seen = []

    def probe(params, batch):
        seen.extend(traced_layout(jax.tree.leaves((params, batch))))
        return loss(params, batch)

    extra = jax.device_put(jnp.zeros(8), NamedSharding(jax.tree.leaves(args)[0].sharding.mesh, P()))
    jax.jit(lambda e, batch, params: jax.grad(probe)(params, batch)).lower(extra, args[1], args[0])
    same = (plan.schedule == made.schedule and plan.loop_plan == made.loop_plan
            and plan.whole_policy == made.whole_policy and plan.measured_peak_bytes == made.measured_peak_bytes)
    return {"error": None, "compiles": compiles, "same": same, "measured": plan.measured_peak_bytes,
            "reordered_layouts_found": seen == [a.sharding for a in jax.tree.leaves(args)]}


def cached(loss, args, budget: int, made: remat_opt.Plan, folder: str) -> dict:
    """The plan ``made`` kept in the plan cache ``folder`` and loaded by another ``optimize``:
    compiles while loading, and what it restores."""
    (entry,) = list_entries(Path(folder))
    step = remat_opt.optimize(loss, budget, cache=folder, solver_options=SOLVER)
    loaded, compiles = count_compiles(lambda: step.plan(*args))
    same = (loaded.schedule == made.schedule and loaded.measured_peak_bytes == made.measured_peak_bytes
            and loaded.collectives == made.collectives and loaded.collective_bytes == made.collective_bytes)
    return {"kind": entry["kind"], "valid": entry["valid"], "compiles": compiles, "same": same,
            "remeasured": remat_opt.peak_bytes(step, *args), "measured": loaded.measured_peak_bytes}


def refusal(loss, args, plain: int) -> dict:
    """A budget far below reach (a quarter of the per-device peak): the error and its message."""
    try:
        remat_opt.optimize(loss, plain // 4, cache=False, solver_options=SOLVER).plan(*args)
    except remat_opt.InfeasibleBudgetError as err:
        return {"error": type(err).__name__, "min_budget": err.min_budget_bytes, "message": str(err)}
    return {"error": None}


def main(cases: list[str]) -> None:
    for case in cases:
        print(json.dumps(run_case(case)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(BUDGET_SHARES))
