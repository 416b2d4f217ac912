"""No simple plan beats remat_opt: the fenced per-layer built-in policies, at their own peaks.

A checkpoint around each layer with one of JAX's built-in policies, fenced as
remat_opt fences its own segments (so XLA keeps the recomputation in the
backward), is the plan a careful user writes by hand. For each zoo model and
each such plan: its XLA peak becomes the budget, and remat_opt is asked for a
plan under it. Its recomputed FLOPs are put beside the hand plan's.

Usage:
    python experiments/fenced_layers.py [--models mlp gpt gpt512] [--policies dots_saveable ...]

Writes ``experiments/results/fenced_layers.csv``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

import remat_opt
from remat_opt.memory import gradient_flops
from remat_opt.rewrite import POLICIES, layer_policy_program
from remat_opt.zoo import MODELS, GPTConfig, MLPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, stamp, write_csv  # noqa: E402

CONFIGS = {
    # The two programs issue 25 measured hand plans on, at CPU-friendly sizes.
    "mlp": ("mlp", MLPConfig(depth=16, width=256, batch=256)),
    "gpt": ("gpt", GPTConfig(num_layers=8, d_model=64, num_heads=4, seq_len=128, batch=4, vocab=128)),
    "gpt512": ("gpt", GPTConfig(num_layers=8, d_model=64, num_heads=4, seq_len=512, batch=2, vocab=128)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    args = parser.parse_args()
    rows = []
    for label in args.models:
        family, config = CONFIGS[label]
        spec = MODELS[family]
        params, batch = spec.init(config, jax.random.key(0))
        base = gradient_flops(spec.loss, (params, batch), {}, 0)
        plain = remat_opt.peak_bytes(spec.loss, params, batch)
        print(f"{label}: plain {plain / MiB:.2f} MiB", flush=True)
        for policy in args.policies:
            hand = layer_policy_program(spec.loss, policy, fenced=True)
            peak = remat_opt.peak_bytes(hand, params, batch)
            hand_flops = gradient_flops(hand, (params, batch), {}, 0) - base
            row = {"model": label, "policy": policy, "plain_peak_bytes": plain, "hand_peak_bytes": peak,
                   "hand_recompute_flops": hand_flops}
            if peak >= plain:
                rows.append({**row, "plan": "budget at or above the plain peak"})
                continue
            start = time.perf_counter()
            try:
                plan = remat_opt.optimize(spec.loss, peak, cache=False).plan(params, batch)
                row.update(plan_peak_bytes=plan.measured_peak_bytes, plan_recompute_flops=plan.measured_recompute_flops,
                           plan=str(plan.loop_plan or f"{plan.num_segments} segments"))
            except remat_opt.InfeasibleBudgetError as err:
                row.update(plan=f"refused; lowest {err.min_budget_bytes}")
            row["plan_seconds"] = round(time.perf_counter() - start, 1)
            rows.append(row)
            ours = row.get("plan_recompute_flops")
            print(f"  fenced per-layer {policy:34s} {peak / MiB:8.2f} MiB +{hand_flops / base:6.2%} | remat_opt "
                  + ("refused" if ours is None else f"{row['plan_peak_bytes'] / MiB:8.2f} MiB +{ours / base:6.2%}"),
                  flush=True)
    write_csv(RESULTS / "fenced_layers.csv", rows, f"{stamp()}; {command()}")


if __name__ == "__main__":
    main()
