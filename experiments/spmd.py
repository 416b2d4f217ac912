"""Sharded training: per-device peak against recompute, three shardings, beside the built-in policies.

The cases of ``tests/spmd_checks.py`` (the zoo MLP on a 2×4 mesh of simulated CPU devices: data
parallel, FSDP over 8 with per-layer weight gathers, data 2 × tensor 4, one ``shard_map`` per
layer; and a model of Megatron MLP blocks written as one ``shard_map``, whose body is planned
per device), each planned by ``remat_opt.optimize`` at a few per-device budgets and measured
beside the fenced per-layer built-in policies. Each row: XLA's per-device peak, the recomputed
FLOPs (counted on the jaxpr), the collective bytes per device (counted on XLA's compiled step,
one pass: a conditional's one branch), and both priced together as the planner prices them
(``priced_flops``: FLOPs plus 1,000 per collective byte beyond the plain step's); and for each
plan, its gradients' largest error against the unsharded ``jax.grad`` (``grad_error``, relative
to each leaf's largest entry).

    python experiments/spmd.py [--cases dp fsdp dp_tp shard_map shard_map_body] [--shares 0.97 0.9 0.85]

Without ``--shares``, each case takes its own (``SHARES``).

A budget below reach is a ``refused@<share>`` row whose ``peak`` is the lowest budget XLA
confirmed.

Writes ``experiments/results/spmd.csv`` (and ``spmd.png`` when matplotlib is installed).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import argparse
import sys
from pathlib import Path

import jax
from jax.sharding import NamedSharding

import remat_opt
from remat_opt.memory import abstract, gradient_flops, gradient_step
from remat_opt.memory._sharded import collective_bytes
from remat_opt.rewrite import layer_policy_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import RESULTS, MiB, command, stamp, write_csv
from spmd_checks import POLICIES, SOLVER, init, layouts, make_loss, mesh, relative_error

SHARES = {"dp_tp": [0.99, 0.98, 0.97], "shard_map_body": [0.9, 0.8, 0.74, 0.65]}
"""Budgets per case, as shares of the plain per-device peak, where ``--shares`` is not given
(0.97, 0.9 and 0.85 otherwise): tensor parallelism leaves little to remat on this MLP, a model
of Megatron blocks written per device leaves more."""
FLOPS_PER_BYTE = remat_opt.Interconnect().flops_per_byte


def measured(fn, args) -> tuple[int, int]:
    """XLA's per-device peak and collective bytes for the gradient step of ``fn``."""
    step, step_args, _ = gradient_step(fn, args, {}, 0, False)
    compiled = jax.jit(step).lower(*abstract(step_args)).compile()
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return int(peak), collective_bytes(compiled.as_text())


def run_case(case: str, shares: list[float]) -> list[dict]:
    m = mesh(case)
    params, batch = init(case)
    loss = make_loss(case, m)
    pspec, bspec = layouts(case, params)
    args = (jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(m, s)), params, pspec),
            jax.tree.map(lambda a: jax.device_put(a, NamedSharding(m, bspec)), batch))
    base = gradient_flops(loss, args, {}, 0)
    plain, plain_coll = measured(loss, args)
    want = jax.grad(loss)(params, batch)  # unsharded, one device
    rows = [{"case": case, "strategy": "plain", "budget": None, "peak": plain, "recompute_flops": 0,
             "overhead": 0.0, "collective_bytes": plain_coll, "grad_error": 0.0}]
    for policy in POLICIES:
        program = layer_policy_program(loss, policy, fenced=True)
        peak, coll = measured(program, args)
        flops = gradient_flops(program, args, {}, 0) - base
        rows.append({"case": case, "strategy": f"fenced_layer/{policy}", "budget": None, "peak": peak,
                     "recompute_flops": flops, "overhead": flops / base, "collective_bytes": coll,
                     "grad_error": None})
    for share in shares:
        budget = int(plain * share)
        try:
            step = remat_opt.optimize(loss, budget, cache=False, solver_options=SOLVER)
            plan = step.plan(*args)
        except remat_opt.InfeasibleBudgetError as err:  # recorded: the lowest budget XLA confirmed
            print(f"{case} at {share:.2f}: below reach ({err.min_budget_bytes / MiB:.2f} MiB is)")
            rows.append({"case": case, "strategy": f"refused@{share:.2f}", "budget": budget,
                         "peak": err.min_budget_bytes, "recompute_flops": None, "overhead": None,
                         "collective_bytes": None, "grad_error": None})
            continue
        rows.append({"case": case, "strategy": f"remat_opt@{share:.2f}", "budget": budget,
                     "peak": plan.measured_peak_bytes, "recompute_flops": plan.measured_recompute_flops,
                     "overhead": plan.measured_recompute_flops / base, "collective_bytes": plan.collective_bytes,
                     "grad_error": relative_error(jax.jit(jax.grad(step))(*args), want)})
        print(plan)
    for r in (r for r in rows if r["overhead"] is not None):
        print(f"  {case:6s} {r['strategy']:34s} {r['peak'] / MiB:7.3f} MiB/device  +{r['overhead']:6.1%} FLOPs  "
              f"{r['collective_bytes'] / MiB:7.3f} MiB collectives")
    return rows


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG")
        return
    cases = sorted({r["case"] for r in rows})
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases):
        for r in (r for r in rows if r["case"] == case and r["overhead"] is not None):
            marker = "o" if r["strategy"].startswith("remat_opt") else "s"
            ax.scatter(r["overhead"] * 100, r["peak"] / MiB, marker=marker)
            ax.annotate(f"{r['strategy']}\n{r['collective_bytes'] / MiB:.2f} MiB coll.",
                        (r["overhead"] * 100, r["peak"] / MiB), fontsize=6)
        ax.set(title=case, xlabel="recomputed FLOPs (% of the gradient)", ylabel="per-device peak (MiB)")
    fig.suptitle(f"{stamp()}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def rows_plain(rows: list[dict], case: str) -> int:
    """The plain step's collective bytes for ``case``."""
    return next(r["collective_bytes"] for r in rows if r["case"] == case and r["strategy"] == "plain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["dp", "fsdp", "dp_tp", "shard_map", "shard_map_body"])
    parser.add_argument("--shares", nargs="+", type=float, default=None)
    options = parser.parse_args()
    rows = [row for case in options.cases
            for row in run_case(case, options.shares or SHARES.get(case, [0.97, 0.9, 0.85]))]
    for r in rows:
        r["priced_flops"] = None if r["recompute_flops"] is None else (
            r["recompute_flops"] + FLOPS_PER_BYTE * (r["collective_bytes"] - rows_plain(rows, r["case"])))
    write_csv(RESULTS / "spmd.csv", rows, f"{stamp()}; devices {jax.device_count()}; {command()}")
    plot(rows, RESULTS / "spmd.png")


if __name__ == "__main__":
    main()
