"""JAX's built-in checkpoint policies, Megatron, Chen and remat_opt, on one zoo model.

Measures XLA's peak (``remat_opt.peak_bytes``: argument + output + temp − alias
of ``jax.jit(jax.value_and_grad(loss))``) for the model as written and for
every baseline of ``remat_opt.all_baselines``: each JAX policy around the
whole loss and around each layer, Megatron-style selective recompute, and
Chen et al.'s sqrt(n) and greedy segmentations (run through remat_opt's fenced
rewriter). It then sets a budget below the lowest peak any JAX policy reaches
(``--margin`` under it) and runs ``remat_opt.optimize`` at that budget.

Prints a markdown table and writes a CSV stamped with the jax version and the
machine. Recompute overhead is counted on each program's jaxpr (forward,
recomputation and backward, minus the plain gradient's): it is what the
program asks for, before XLA's CSE (docs/xla_findings.md §4), so for unfenced
``jax.checkpoint`` it can show recomputation that XLA then removes.

Usage:
    python experiments/policies_table.py [--model gpt] [--margin 0.05]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import platform
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np

import remat_opt
from remat_opt.zoo import MODELS

MiB = 2**20
RESULTS = Path(__file__).resolve().parent / "results"
POLICY_PREFIXES = ("checkpoint/", "layer_checkpoint/")


def machine() -> str:
    """A short description of the host: platform, processor and JAX backend."""
    processor = platform.processor() or platform.machine()
    return f"{platform.platform()}; {processor}; {platform.node()}; jax backend {jax.default_backend()}"


def max_grad_error(step, loss, params, batch) -> float:
    """Largest absolute difference between ``step``'s gradients and plain ``jax.grad``'s."""
    got = jax.jit(jax.grad(step))(params, batch)
    want = jax.jit(jax.grad(loss))(params, batch)
    pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)


def row_of(plan: remat_opt.Plan, seconds: float | None = None, note: str = "") -> dict:
    recompute = plan.measured_recompute_flops
    return {
        "strategy": plan.strategy,
        "measured_peak_bytes": plan.measured_peak_bytes,
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "budget_bytes": plan.budget_bytes,
        "fits": plan.fits,
        "measured_recompute_flops": recompute,
        "baseline_flops": plan.baseline_flops,
        "recompute_overhead": None if recompute is None else recompute / plan.baseline_flops,
        "segments": plan.num_segments,
        "status": plan.status,
        "seconds": seconds,
        "grad_error": None,
        "note": note,
    }


def run_remat_opt(spec, params, batch, budget: int, options: remat_opt.SolverOptions, label: str) -> dict:
    """``remat_opt.optimize`` at ``budget``: its plan, re-measured and gradient-checked, as a row."""
    start = time.perf_counter()
    try:
        step = remat_opt.optimize(spec.loss, budget, solver_options=options)
        plan = step.plan(params, batch)
    except remat_opt.RematOptError as err:
        seconds = time.perf_counter() - start
        print(f"{label} FAILED at {budget / MiB:.2f} MiB after {seconds:.0f} s: {type(err).__name__}: {err}")
        return {"strategy": label, "measured_peak_bytes": None, "predicted_peak_bytes": None,
                "budget_bytes": budget, "fits": False, "measured_recompute_flops": None, "baseline_flops": None,
                "recompute_overhead": None, "segments": None, "status": type(err).__name__,
                "seconds": seconds, "grad_error": None, "note": "no plan"}
    seconds = time.perf_counter() - start
    independent = remat_opt.peak_bytes(step, params, batch)
    grad_error = max_grad_error(step, spec.loss, params, batch)
    note = "" if independent == plan.measured_peak_bytes else f"re-measured {independent / MiB:.2f} MiB"
    print(f"{label}: {plan}")
    print(f"{label}: planned and verified in {seconds:.0f} s; independent peak_bytes "
          f"{independent / MiB:.2f} MiB; max |grad - jax.grad| = {grad_error:.2e}")
    return {**row_of(dataclasses.replace(plan, strategy=label), seconds, note), "grad_error": grad_error}


def markdown(rows: list[dict], plain: int) -> str:
    def mib(x: int | None) -> str:
        return "—" if x is None else f"{x / MiB:.2f}"

    lines = [
        "| strategy | measured peak MiB | vs plain | predicted MiB | budget MiB | fits budget? "
        "| recompute FLOPs overhead |",
        "|---|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in rows:
        measured = r["measured_peak_bytes"]
        ratio = "—" if measured is None else f"{measured / plain:.1%}"
        fits = {True: "yes", False: "no", None: "—"}[r["fits"]]
        overhead = "—" if r["recompute_overhead"] is None else f"{r['recompute_overhead']:+.1%}"
        name = r["strategy"] + (f" ({r['note']})" if r["note"] else "")
        lines.append(
            f"| {name} | {mib(measured)} | {ratio} | {mib(r['predicted_peak_bytes'])} "
            f"| {mib(r['budget_bytes'])} | {fits} | {overhead} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt", choices=sorted(MODELS), help="zoo model, default config")
    parser.add_argument("--margin", type=float, default=0.05,
                        help="budget = (1 - margin) x the lowest peak of any JAX policy (default 0.05)")
    parser.add_argument("--measure-top", type=int, default=3, help="greedy Chen candidates measured on XLA")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="CP-SAT wall-clock limit per solve, seconds (default: SolverOptions')")
    parser.add_argument("--match", default="chen_greedy",
                        help="comma-separated strategies whose measured peak remat_opt is also run at "
                             "(same memory, compare recompute); '' for none (default: chen_greedy)")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed of the model's init")
    parser.add_argument("--out", type=Path, default=RESULTS / "policies_table.csv", help="CSV to write")
    args = parser.parse_args(argv)
    if not 0 < args.margin < 1:
        parser.error(f"--margin must be in (0, 1); got {args.margin}")

    command = "python experiments/policies_table.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"Reproduce: {command.strip()}")
    print(f"jax {jax.__version__}; {machine()}")

    spec = MODELS[args.model]
    config = spec.default_config
    params, batch = spec.init(config, jax.random.PRNGKey(args.seed))
    print(f"model: {args.model} {config}\n")

    start = time.perf_counter()
    plans = remat_opt.all_baselines(remat_opt.BaselineCall(spec.loss, (params, batch), budget_bytes=1 << 62),
                                    measure_top=args.measure_top)
    baseline_seconds = time.perf_counter() - start
    plain = plans[0].plain_peak_bytes
    policy_peaks = [p.measured_peak_bytes for p in plans if p.strategy.startswith(POLICY_PREFIXES)]
    budget = int(min(policy_peaks) * (1 - args.margin))
    plans = [dataclasses.replace(p, budget_bytes=budget) for p in plans]
    print(f"baselines measured in {baseline_seconds:.0f} s; lowest JAX-policy peak "
          f"{min(policy_peaks) / MiB:.2f} MiB -> budget {budget / MiB:.2f} MiB ({budget / plain:.1%} of plain)")

    rows = [row_of(p) for p in plans]
    options = remat_opt.SolverOptions()
    if args.time_limit is not None:
        options = dataclasses.replace(options, time_limit_s=args.time_limit)
    by_name = {p.strategy: p for p in plans}
    targets = [("remat_opt", budget)]
    for name in filter(None, args.match.split(",")):
        if name not in by_name:
            parser.error(f"--match: unknown strategy {name!r}; choose from {sorted(by_name)}")
        targets.append((f"remat_opt @ {name} peak", by_name[name].measured_peak_bytes))
    main_fits = True
    for label, target in targets:
        row = run_remat_opt(spec, params, batch, target, options, label)
        rows.append(row)
        if label == "remat_opt":
            main_fits = bool(row["fits"])

    print()
    print(markdown(rows, plain))
    print()
    print(f"budget {budget / MiB:.2f} MiB = (1 - {args.margin}) x lowest JAX-policy peak; "
          f"plain peak {plain / MiB:.2f} MiB; recompute overhead counted on the jaxpr "
          f"(before XLA's CSE), relative to the plain gradient's {plans[0].baseline_flops:,} FLOPs.")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"model": args.model, "config": repr(config), "jax_version": jax.__version__,
             "machine": machine(), "command": command.strip(), }
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*rows[0], *stamp])
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, **stamp})
    print(f"wrote {args.out}")
    return 0 if main_fits else 1


if __name__ == "__main__":
    sys.exit(main())
