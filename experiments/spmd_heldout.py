"""Whole-model ``shard_map`` programs not used while the body's planning was built: per-device peak and recompute against the fenced per-block built-in policies.

The body planner's facts (views, outside bytes, the output copy, late Chen cuts) were found on
``tests/spmd_checks.py``'s ``shard_map_body`` (Megatron GELU MLP blocks). These two programs
were written afterwards and nothing was tuned on them:

- ``glu``: six SwiGLU blocks, width 128, hidden 512 (gate and up projections split by columns
  over ``model``, the down projection by rows, ``psum`` after it), batch 512 over ``data``;
- ``pairs``: the zoo MLP's ``tanh`` layers, depth 6, width 256, as Megatron pairs in one
  ``shard_map`` (a column-parallel layer, then a row-parallel one summed with ``psum``).

Each row: XLA's per-device peak, the recomputed FLOPs counted on the jaxpr, and the collective
bytes beyond the plain step's priced at the default interconnect (``priced_flops``).

    python experiments/spmd_heldout.py [--shares 0.9 0.8 0.7]

Writes ``experiments/results/spmd_heldout.csv``.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import remat_opt
from remat_opt.memory import gradient_flops
from remat_opt.rewrite import layer_policy_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import RESULTS, MiB, command, stamp, write_csv
from spmd import measured
from spmd_checks import POLICIES, SOLVER, mesh, relative_error

try:  # jax >= 0.7
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

FLOPS_PER_BYTE = remat_opt.Interconnect().flops_per_byte


def glu_block(p, x):
    return x + jax.lax.psum((jax.nn.silu(x @ p["wg"]) * (x @ p["wu"])) @ p["wd"], "model")


def column_layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def row_layer(p, x):
    return jnp.tanh(jax.lax.psum(x @ p["w"], "model") + p["b"])


def program(name: str, m):
    """``(loss(params, batch, layer_wrapper=None), params, batch, param specs)``."""
    k = iter(jax.random.split(jax.random.key(1), 32))
    if name == "glu":
        d, h, depth, batch = 128, 512, 6, 512
        params = [{"wg": jax.random.normal(next(k), (d, h)) / d ** 0.5, "wu": jax.random.normal(next(k), (d, h)) / d ** 0.5,
                   "wd": jax.random.normal(next(k), (h, d)) / (4 * h ** 0.5)} for _ in range(depth)]
        specs = [{"wg": P(None, "model"), "wu": P(None, "model"), "wd": P("model", None)}] * depth
        layers = [glu_block] * depth
    else:
        d, depth, batch = 256, 6, 1024
        params = [{"w": jax.random.normal(next(k), (d, d)) / d ** 0.5, "b": jnp.zeros(d)} for _ in range(depth)]
        specs = [{"w": P(None, "model"), "b": P("model")} if i % 2 == 0 else {"w": P("model", None), "b": P()}
                 for i in range(depth)]
        layers = [column_layer if i % 2 == 0 else row_layer for i in range(depth)]
    x, y = jax.random.normal(next(k), (batch, d)), jax.random.normal(next(k), (batch, d))

    def loss(params, batch, layer_wrapper=None):
        wrap = layer_wrapper or (lambda f: f)

        def per_device(params, x):
            for f, p in zip(layers, params):
                x = wrap(f)(p, x)
            return x

        out = shard_map(per_device, mesh=m, in_specs=(specs, P("data")), out_specs=P("data"))(params, batch["x"])
        return jnp.mean(jnp.square(out - batch["y"]))

    args = (jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(m, s)), params, specs),
            jax.tree.map(lambda a: jax.device_put(a, NamedSharding(m, P("data"))), {"x": x, "y": y}))
    return loss, args


def run(name: str, shares: list[float]) -> list[dict]:
    m = mesh()
    loss, args = program(name, m)
    base = gradient_flops(loss, args, {}, 0)
    plain, plain_coll = measured(loss, args)
    want = jax.grad(loss)(*args)
    rows = [{"program": name, "strategy": "plain", "budget": None, "peak": plain, "recompute_flops": 0,
             "collective_bytes": plain_coll, "grad_error": 0.0}]
    for policy in POLICIES:
        fenced = layer_policy_program(loss, policy, fenced=True)
        peak, coll = measured(fenced, args)
        rows.append({"program": name, "strategy": f"fenced_block/{policy}", "budget": None, "peak": peak,
                     "recompute_flops": gradient_flops(fenced, args, {}, 0) - base, "collective_bytes": coll,
                     "grad_error": None})
    for share in shares:
        budget = int(plain * share)
        try:
            step = remat_opt.optimize(loss, budget, cache=False, solver_options=SOLVER)
            plan = step.plan(*args)
        except remat_opt.InfeasibleBudgetError as err:
            rows.append({"program": name, "strategy": f"refused@{share:.2f}", "budget": budget,
                         "peak": err.min_budget_bytes, "recompute_flops": None, "collective_bytes": None,
                         "grad_error": None})
            continue
        error = relative_error(jax.jit(jax.grad(step))(*args), want)
        rows.append({"program": name, "strategy": f"remat_opt@{share:.2f}", "budget": budget,
                     "peak": plan.measured_peak_bytes, "recompute_flops": plan.measured_recompute_flops,
                     "collective_bytes": plan.collective_bytes, "grad_error": error})
    for r in rows:
        r["priced_flops"] = None if r["recompute_flops"] is None else (
            r["recompute_flops"] + FLOPS_PER_BYTE * (r["collective_bytes"] - plain_coll))
        r["overhead"] = None if r["recompute_flops"] is None else r["recompute_flops"] / base
        overhead = "" if r["overhead"] is None else f"{r['overhead']:+.1%}"
        print(f"{name:6s} {r['strategy']:32s} {r['peak'] / MiB:8.3f} MiB {overhead}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=["glu", "pairs"])
    parser.add_argument("--shares", nargs="+", type=float, default=[0.9, 0.8, 0.7])
    options = parser.parse_args()
    rows = [r for name in options.programs for r in run(name, options.shares)]
    write_csv(RESULTS / "spmd_heldout.csv", rows, f"{stamp()}; devices {jax.device_count()}; {command()}")


if __name__ == "__main__":
    main()
