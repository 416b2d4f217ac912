"""Scanned decoder: remat_opt's loop plans against MaxText's remat recipes, at depth.

The zoo GPT written as MaxText writes a decoder (``lax.scan`` over stacked
layers, projections tagged ``query_proj`` ... ``mlpwo``,
:func:`remat_opt.zoo.gpt.scan_loss`), at several depths. For each depth:

1. every MaxText recipe (:data:`remat_opt.baselines._maxtext.RECIPES`) on the
   scan body, measured on XLA: peak and recomputed FLOPs;
2. five budgets, evenly spaced from the lowest peak any recipe reaches to the
   plain peak (the top one just under it);
3. at each, ``remat_opt.optimize(..., unroll_scans=0)`` (the scan stays a loop;
   CP-SAT chooses what the body saves, :mod:`remat_opt.solve._body`): its XLA
   peak, recomputed FLOPs, gradient error against ``jax.grad``, ``plan()``
   wall time, beside the cheapest recipe that fits and one plain compile.

Usage:
    python experiments/scan_recipes.py [--layers 12 48 96] [--quick] [--output scan_recipes.csv]

Writes ``experiments/results/scan_recipes.csv`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

import remat_opt
from remat_opt.baselines import RECIPES, recipe_program
from remat_opt.memory import gradient_flops
from remat_opt.zoo import gpt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv  # noqa: E402


def model(layers: int, quick: bool) -> tuple:
    config = gpt.GPTConfig(num_layers=layers, d_model=64, num_heads=4, seq_len=64 if quick else 128,
                           batch=4, vocab=128)
    params, batch = gpt.init(config, jax.random.key(0))
    return gpt.stack_layers(params), batch


def compile_seconds(fn, params, batch) -> float:
    start = time.perf_counter()
    jax.jit(jax.value_and_grad(fn)).lower(params, batch).compile()
    return time.perf_counter() - start


def recipes(params, batch, base: int) -> dict[str, tuple[int, int]]:
    """Recipe -> (XLA peak, recomputed FLOPs)."""
    out = {}
    for name in RECIPES:
        program = recipe_program(gpt.scan_loss, name)
        out[name] = (remat_opt.peak_bytes(program, params, batch),
                     gradient_flops(program, (params, batch), {}, 0) - base)
        print(f"  {name:34s} {out[name][0] / MiB:8.2f} MiB  +{out[name][1] / base:.2%}", flush=True)
    return out


def plan_row(layers: int, budget: int, params, batch, base: int, plain: int, menu: dict, compile_s: float) -> dict:
    step = remat_opt.optimize(gpt.scan_loss, budget, unroll_scans=0, cache=False)
    start = time.perf_counter()
    try:
        plan = step.plan(params, batch)
    except remat_opt.InfeasibleBudgetError as err:
        plan, refused = None, err.min_budget_bytes
    seconds = time.perf_counter() - start
    fitting = {k: v for k, v in menu.items() if v[0] <= budget}
    best = min(fitting, key=lambda k: fitting[k][1], default=None)
    row = {"layers": layers, "budget_bytes": budget, "plain_peak_bytes": plain,
           "plan_seconds": round(seconds, 1), "plain_compile_seconds": round(compile_s, 1),
           "best_recipe": best or "", "best_recipe_peak_bytes": fitting[best][0] if best else "",
           "best_recipe_recompute_flops": fitting[best][1] if best else ""}
    if plan is None:
        return {**row, "plan": f"refused (min {refused})"}
    error = grad_error_over_tolerance(jax.grad(step)(params, batch), jax.grad(gpt.scan_loss)(params, batch))
    return {**row, "plan": str(plan.loop_plan or "schedule"), "measured_peak_bytes": plan.measured_peak_bytes,
            "recompute_flops": plan.measured_recompute_flops, "grad_error_over_tol": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 48, 96])
    parser.add_argument("--quick", action="store_true", help="sequence length 64 instead of 128")
    parser.add_argument("--output", default="scan_recipes.csv", help="file name under experiments/results")
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        params, batch = model(layers, args.quick)
        base = gradient_flops(gpt.scan_loss, (params, batch), {}, 0)
        plain = remat_opt.peak_bytes(gpt.scan_loss, params, batch)
        compile_s = compile_seconds(gpt.scan_loss, params, batch)
        print(f"{layers} layers: plain {plain / MiB:.2f} MiB, one plain compile {compile_s:.1f} s", flush=True)
        menu = recipes(params, batch, base)
        low = min(peak for peak, _ in menu.values())
        budgets = [int(low + (plain - 1 - low) * k / 4) for k in range(5)]
        for budget in budgets:
            rows.append(plan_row(layers, budget, params, batch, base, plain, menu, compile_s))
            r = rows[-1]
            ours = "" if r.get("recompute_flops") is None else f"+{r['recompute_flops'] / base:.2%}"
            theirs = "-" if not r["best_recipe"] else f"{r['best_recipe']} +{r['best_recipe_recompute_flops'] / base:.2%}"
            print(f"  budget {budget / MiB:8.2f} MiB: {r['plan']} {ours} vs {theirs}; "
                  f"plan() {r['plan_seconds']} s ({r['plan_seconds'] / compile_s:.1f}x a compile)", flush=True)
    write_csv(RESULTS / args.output, rows, f"{stamp()}; {command()}")


if __name__ == "__main__":
    main()
