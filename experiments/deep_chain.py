"""Deep chains at tight budgets: nested checkpoints against Chen and Revolve.

A flat schedule (each segment recomputed once) cannot go below about two
square roots of the chain; Griewank's Revolve goes lower by recomputing some
layers more than once. On a deep MLP chain this measures, on XLA, Chen's
sqrt(n) and greedy segmentations, Revolve's lowest-memory binomial schedule,
and remat_opt: at its own lowest budget (the ``min_budget_bytes`` of the
error a one-byte budget raises) and at each baseline's measured peak. The
script exits non-zero if remat_opt misses a budget, or, where a baseline
fits, fails to fit its peak with no more recomputed FLOPs.

Usage:
    python experiments/deep_chain.py [--depth 32] [--width 128] [--batch 512] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

import remat_opt
from remat_opt.zoo import MODELS, MLPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, mib, stamp, write_csv  # noqa: E402


def describe(plan: remat_opt.Plan) -> str:
    schedule = plan.schedule
    depth = schedule.depth() if schedule is not None else 1
    return f"{plan.num_segments} segments" + (f", nested {depth} levels" if depth > 1 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="a short solve on two workers (for the tests)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    options = (remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=2.0, num_workers=2)
               if args.quick else remat_opt.SolverOptions())
    header = f"{stamp()}\nreproduce: {command()}"
    print(header, flush=True)
    spec = MODELS["mlp"]
    config = MLPConfig(depth=args.depth, width=args.width, batch=args.batch)
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    plain = remat_opt.peak_bytes(spec.loss, params, batch)
    print(f"{config}: plain peak {plain / MiB:.2f} MiB", flush=True)

    call = remat_opt.BaselineCall(spec.loss, (params, batch), budget_bytes=plain)
    baselines = [remat_opt.chen_sqrt_n(call), remat_opt.chen_greedy(call), remat_opt.revolve(call)]
    try:
        remat_opt.optimize(spec.loss, 1, solver_options=options).plan(params, batch)
        raise AssertionError("a one-byte budget was met")
    except remat_opt.InfeasibleBudgetError as err:
        lowest = err.min_budget_bytes
        if err.lower_bound:  # one byte is under the step's arguments and outputs: the search runs there
            try:
                remat_opt.optimize(spec.loss, lowest, solver_options=options).plan(params, batch)
            except remat_opt.InfeasibleBudgetError as searched:
                lowest = searched.min_budget_bytes
    rows, failures = [], []
    for b in baselines:
        rows.append({"strategy": b.strategy, "budget_bytes": None, "measured_peak_bytes": b.measured_peak_bytes,
                     "predicted_peak_bytes": b.predicted_peak_bytes,
                     "overhead": b.measured_recompute_flops / b.baseline_flops, "plan": describe(b)})
    budgets = sorted({lowest, *(b.measured_peak_bytes for b in baselines)})
    for budget in budgets:
        if budget < lowest:
            continue
        plan = remat_opt.optimize(spec.loss, budget, solver_options=options).plan(params, batch)
        if not plan.fits:
            failures.append(f"remat_opt missed {budget:,} bytes")
        rows.append({"strategy": "remat_opt", "budget_bytes": budget, "measured_peak_bytes": plan.measured_peak_bytes,
                     "predicted_peak_bytes": plan.predicted_peak_bytes,
                     "overhead": plan.measured_recompute_flops / plan.baseline_flops, "plan": describe(plan)})
    for b in baselines:
        ours = next((r for r in rows if r["strategy"] == "remat_opt" and r["budget_bytes"] == b.measured_peak_bytes),
                    None)
        if ours is None or ours["overhead"] > b.measured_recompute_flops / b.baseline_flops + 1e-12:
            failures.append(f"remat_opt does not match {b.strategy} at its peak")
    write_csv(args.out / "deep_chain.csv", rows, header)
    print("\n| strategy | budget MiB | measured MiB | predicted MiB | extra FLOPs | plan |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        budget = "" if r["budget_bytes"] is None else f"{r['budget_bytes'] / MiB:.2f}"
        print(f"| {r['strategy']} | {budget} | {r['measured_peak_bytes'] / MiB:.2f} | "
              f"{mib(r['predicted_peak_bytes'])} | {r['overhead']:+.1%} | {r['plan']} |")
    print(f"\nremat_opt's lowest: {lowest / MiB:.2f} MiB; "
          + ("; ".join(failures) if failures else "every budget met; at each baseline's peak remat_opt recomputes no more"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
