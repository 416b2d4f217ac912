"""Scanned decoders written with Flax Linen, Flax NNX and Equinox, against MaxText's recipes (issue 25, item 7).

The held-out scanned decoders of :mod:`heldout_scan_programs` (``nn.scan``,
``nnx.scan`` over ``nnx.vmap``-built layers, ``lax.scan`` over
``eqx.filter_vmap``-stacked layers), their projections tagged with MaxText's
``checkpoint_name``s, at ``--layers`` layers. For each program, as
``experiments/scan_recipes.py`` does for the zoo's scanned GPT:

1. every MaxText recipe (:data:`remat_opt.baselines._maxtext.RECIPES`),
   applied as that library's users apply it: the library's own per-layer
   remat with the recipe's ``save_only_these_names`` policy (``nn.remat``
   inside ``nn.scan``, ``nnx.remat`` on the scanned function,
   ``eqx.filter_checkpoint`` as the scan body); its XLA peak, the FLOPs it
   recomputes over the plain step (counted on the jaxpr), and its gradients
   against the plain step's;
2. five budgets, evenly spaced from the lowest peak any recipe reaches to the
   plain peak (the top one just under it);
3. at each, ``remat_opt.optimize(loss, budget, unroll_scans=0)`` on the plain
   program (the scan stays a loop; CP-SAT chooses what the body saves): its
   XLA peak against the budget, its recomputed FLOPs against the best recipe
   that fits, its gradients against the plain step's (as a fraction of the
   rtol 1e-5 / atol 1e-6 tolerance: at most 1 is equal), and ``plan()``'s wall
   time against one plain compile of the library's own step.

These programs are held out: nothing of remat_opt may be tuned on what this prints.

Usage:
    python experiments/library_scan.py [--layers 12] [--programs flax_linen_scan flax_nnx_scan equinox_scan]
        [--quick] [--output library_scan.csv]

``--quick`` builds width 48, sequence 32 instead of width 80, sequence 64.
Writes ``experiments/results/library_scan.csv`` (or ``--output``), stamped
with the jax version and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import jax

import remat_opt
from remat_opt.baselines import RECIPES
from remat_opt.memory import gradient_flops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv
from heldout_programs import Program
from heldout_scan_programs import SCAN_PROGRAMS, Sizes, gradients


def compile_seconds(program: Program) -> float:
    """Wall time of one compile of the library's own plain gradient step."""
    start = time.perf_counter()
    if all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(program.args)):
        jax.jit(jax.value_and_grad(program.loss, argnums=program.argnums)).lower(*program.args).compile()
    else:
        import equinox as eqx

        eqx.filter_jit(eqx.filter_value_and_grad(program.loss)).lower(*program.args).compile()
    return time.perf_counter() - start


def recipes(name: str, sizes: Sizes, base: int, want: list) -> dict[str, dict[str, Any]]:
    """Recipe -> its XLA peak, recomputed FLOPs and gradient error, applied as the library's own remat."""
    out = {}
    for recipe in RECIPES:
        variant = SCAN_PROGRAMS[name](sizes, recipe)
        out[recipe] = {
            "peak": remat_opt.peak_bytes(variant.loss, *variant.args, argnums=variant.argnums),
            "recompute": gradient_flops(variant.loss, variant.args, {}, variant.argnums) - base,
            "grad_error": grad_error_over_tolerance(gradients(variant), want),
        }
        r = out[recipe]
        print(f"  {recipe:34s} {r['peak'] / MiB:8.2f} MiB  +{r['recompute'] / base:6.2%}  "
              f"gradient error {r['grad_error']:.2g} x tol", flush=True)
    return out


def plan_row(name: str, program: Program, budget: int, plain: int, base: int, menu: dict, want: list,
             compile_s: float) -> dict:
    """remat_opt's plan at ``budget``, measured, beside the best recipe that fits."""
    step = remat_opt.optimize(program.loss, budget, argnums=program.argnums, unroll_scans=0, cache=False)
    start = time.perf_counter()
    try:
        plan = step.plan(*program.args)
    except remat_opt.InfeasibleBudgetError as err:
        plan, refused = None, err.min_budget_bytes
    seconds = time.perf_counter() - start
    fitting = {k: v for k, v in menu.items() if v["peak"] <= budget}
    best = min(fitting, key=lambda k: (fitting[k]["recompute"], fitting[k]["peak"]), default=None)
    row = {"program": name, "budget_bytes": budget, "plain_peak_bytes": plain, "plain_flops": base,
           "plan_seconds": round(seconds, 1), "plain_compile_seconds": round(compile_s, 1),
           "plan_over_compile": round(seconds / compile_s, 1),
           "best_recipe": best or "", "best_recipe_peak_bytes": fitting[best]["peak"] if best else "",
           "best_recipe_recompute_flops": fitting[best]["recompute"] if best else ""}
    if plan is None:
        return {**row, "plan": f"refused (lowest peak {refused})"}
    error = grad_error_over_tolerance(gradients(program, step), want)
    recompute = plan.measured_recompute_flops
    return {**row, "plan": str(plan.loop_plan or f"schedule with the scan whole, {plan.num_segments} segments"),
            "status": plan.status, "measured_peak_bytes": plan.measured_peak_bytes, "recompute_flops": recompute,
            "fits": plan.measured_peak_bytes <= budget,
            "no_more_than_best_recipe": best is None or recompute <= fitting[best]["recompute"],
            "grad_error_over_tol": error}


def run(name: str, sizes: Sizes) -> list[dict]:
    program = SCAN_PROGRAMS[name](sizes)
    print(f"{name}: {program.description}", flush=True)
    base = gradient_flops(program.loss, program.args, {}, program.argnums)
    plain = remat_opt.peak_bytes(program.loss, *program.args, argnums=program.argnums)
    compile_s = compile_seconds(program)
    want = gradients(program)
    print(f"  plain {plain / MiB:.2f} MiB, one plain compile {compile_s:.1f} s", flush=True)
    menu = recipes(name, sizes, base, want)
    low = min(r["peak"] for r in menu.values())
    rows = [{"program": name, "layers": sizes.layers, "recipe": recipe, "recipe_peak_bytes": r["peak"],
             "recipe_recompute_flops": r["recompute"], "recipe_grad_error_over_tol": r["grad_error"],
             "plain_peak_bytes": plain, "plain_flops": base} for recipe, r in menu.items()]
    for budget in [int(low + (plain - 1 - low) * k / 4) for k in range(5)]:
        row = {"layers": sizes.layers, **plan_row(name, program, budget, plain, base, menu, want, compile_s)}
        rows.append(row)
        ours = row["plan"] if row.get("recompute_flops") is None else (
            f"{row['measured_peak_bytes'] / MiB:.2f} MiB +{row['recompute_flops'] / base:.2%}, {row['plan']}")
        theirs = "none fits" if not row["best_recipe"] else (
            f"{row['best_recipe']} +{row['best_recipe_recompute_flops'] / base:.2%}")
        grad = "" if row.get("grad_error_over_tol") is None else f", gradient error {row['grad_error_over_tol']:.2g}"
        print(f"  budget {budget / MiB:8.2f} MiB: {ours} vs {theirs}{grad}; plan() {row['plan_seconds']} s "
              f"({row['plan_over_compile']}x a compile)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--programs", nargs="+", default=list(SCAN_PROGRAMS), choices=list(SCAN_PROGRAMS))
    parser.add_argument("--quick", action="store_true", help="width 48, sequence 32 (default: 80, 64)")
    parser.add_argument("--output", default="library_scan.csv", help="file name under experiments/results")
    args = parser.parse_args(argv)
    sizes = Sizes(layers=args.layers)
    if args.quick:
        sizes = dataclasses.replace(sizes, d_model=48, seq=32)
    rows = []
    for name in args.programs:  # written after each program: a long run keeps what it measured
        rows += run(name, sizes)
        write_csv(RESULTS / args.output, rows, f"{stamp()}; {command()}")


if __name__ == "__main__":
    main()
