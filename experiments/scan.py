"""Scan over layers: remat_opt against the checkpoints users write by hand on the loop.

The zoo GPT written the way large JAX models are (``lax.scan`` over stacked
layer params, :func:`remat_opt.zoo.gpt.scan_loss`) and every hand-written
alternative a user would try on it, each measured on XLA: the scan body under
``jax.checkpoint`` with each of JAX's built-in policies, and the scan split into
``groups`` nested scans (each group checkpointed whole; the group counts
nearest sqrt(L)), with and without a body policy. Then remat_opt is asked for
budgets below the plain peak (by default: the peak of the cheapest
hand-written alternative at three memory levels), and at each budget its
recomputed FLOPs are put beside the best hand-written alternative that fits.

Usage:
    python experiments/scan.py [--layers 12] [--budgets MiB ...] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

import remat_opt
from remat_opt.rewrite import near_sqrt_divisors
from remat_opt.memory import gradient_flops
from remat_opt.rewrite import POLICIES
from remat_opt.zoo import gpt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv  # noqa: E402

# A quick run tries the body as written and under these two policies only.
QUICK_POLICIES = ("nothing_saveable", "dots_saveable")


def hand_written(params, batch, layers: int, baseline_flops: int, policies=tuple(POLICIES)) -> list[dict]:
    """Every hand-written alternative (of ``policies``), measured: peak and recomputed FLOPs."""
    rows = []
    for policy in (None, *policies):
        for groups in (1, *sorted(near_sqrt_divisors(layers))):
            if policy is None and groups == 1:
                continue
            pol = None if policy is None else POLICIES[policy]

            def loss(p, b, pol=pol, groups=groups):
                return gpt.scan_loss(p, b, body_policy=pol, groups=groups)

            name = f"body {policy or 'as written'}" + (f", {groups} groups" if groups > 1 else "")
            rows.append({
                "strategy": name,
                "measured_peak_bytes": remat_opt.peak_bytes(loss, params, batch),
                "recompute_flops": gradient_flops(loss, (params, batch), {}, 0) - baseline_flops,
            })
            print(f"  {name:48s} {rows[-1]['measured_peak_bytes'] / MiB:8.2f} MiB "
                  f"+{rows[-1]['recompute_flops'] / baseline_flops:.1%}", flush=True)
    return rows


def default_budgets(rows: list[dict], plain: int) -> list[int]:
    """The peaks of the cheapest hand-written alternatives under 0.5, 0.35 and
    0.25 of the plain peak (budgets a hand-written plan meets exactly), and
    budgets between them, where the next alternative down costs more: 0.65 of
    the plain peak and the midpoint of the two tightest."""
    peaks = []
    for frac in (0.5, 0.35, 0.25):
        fitting = [r for r in rows if r["measured_peak_bytes"] <= frac * plain]
        if fitting:
            best = min(fitting, key=lambda r: (r["recompute_flops"], r["measured_peak_bytes"]))
            peaks.append(best["measured_peak_bytes"])
    peaks = sorted(set(peaks), reverse=True)
    between = [int(0.65 * plain)] + ([(peaks[-2] + peaks[-1]) // 2] if len(peaks) >= 2 else [])
    return sorted(set(peaks + between), reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--budgets", type=float, nargs="*", help="budgets in MiB (default: see default_budgets)")
    parser.add_argument("--quick", action="store_true",
                        help="a small model, two policies, the tightest budget, the scan planned whole (for the tests)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    header = f"{stamp()}\nreproduce: {command()}"
    print(header, flush=True)

    if args.quick:
        config = gpt.GPTConfig(num_layers=args.layers, d_model=32, seq_len=32, batch=2, vocab=64)
        options = remat_opt.SolverOptions(time_limit_s=60, deterministic_time_limit=1.0, num_workers=2)
    else:
        config = gpt.GPTConfig(num_layers=args.layers)
        options = remat_opt.SolverOptions()
    params, batch = gpt.init(config, jax.random.PRNGKey(0))
    params = gpt.stack_layers(params)
    loss = gpt.scan_loss
    plain = remat_opt.peak_bytes(loss, params, batch)
    baseline_flops = gradient_flops(loss, (params, batch), {}, 0)
    print(f"{config}\nscan as written: {plain / MiB:.2f} MiB", flush=True)
    rows = [{"strategy": "no remat", "budget_bytes": None, "measured_peak_bytes": plain, "recompute_flops": 0}]
    rows += hand_written(params, batch, args.layers, baseline_flops,
                         QUICK_POLICIES if args.quick else tuple(POLICIES))
    want = jax.jit(jax.grad(loss))(params, batch)
    budgets = [int(b * MiB) for b in args.budgets] if args.budgets else default_budgets(rows, plain)
    if args.quick and not args.budgets:
        budgets = budgets[-1:]  # the tightest

    table = []
    for budget in budgets:
        start = time.perf_counter()
        # A quick run plans the scan whole (loop plans only): the unrolled solve is the slow part.
        step = remat_opt.optimize(loss, budget, solver_options=options, **({"unroll_scans": 0} if args.quick else {}))
        plan = step.plan(params, batch)
        wall = time.perf_counter() - start
        got = jax.jit(jax.grad(step))(params, batch)
        grad_error = grad_error_over_tolerance(got, want)
        kind = str(plan.loop_plan) if plan.loop_plan is not None else f"unrolled, {plan.num_segments} segments"
        rows.append({"strategy": "remat_opt", "budget_bytes": budget, "measured_peak_bytes": plan.measured_peak_bytes,
                     "predicted_peak_bytes": plan.predicted_peak_bytes,
                     "recompute_flops": plan.measured_recompute_flops, "plan": kind, "status": plan.status,
                     "wall_seconds": round(wall, 1), "grad_error_over_tolerance": grad_error})
        fitting = [r for r in rows if r["strategy"] not in ("remat_opt", "no remat")
                   and r["measured_peak_bytes"] <= budget]
        best = min(fitting, key=lambda r: r["recompute_flops"], default=None)
        table.append((budget, plan, kind, best, wall))
        print(f"budget {budget / MiB:.2f} MiB: {plan}  [{kind}, {wall:.0f}s; gradient error "
              f"{grad_error:.2f} of the rtol 1e-5/atol 1e-6 tolerance]", flush=True)

    write_csv(args.out / ("scan_quick.csv" if args.quick else "scan.csv"), rows, header)
    print(f"\n{config.num_layers}-layer scan GPT, plain (scan as written) {plain / MiB:.2f} MiB; {stamp()}")
    print("| budget MiB | remat_opt: measured MiB, extra FLOPs, plan | best hand-written that fits: "
          "measured MiB, extra FLOPs |")
    print("|---:|---|---|")
    for budget, plan, kind, best, _ in table:
        mine = (f"{plan.measured_peak_bytes / MiB:.2f}, +{plan.measured_recompute_flops / baseline_flops:.1%}, "
                f"{kind}")
        theirs = "none fits" if best is None else (
            f"{best['strategy']}: {best['measured_peak_bytes'] / MiB:.2f}, "
            f"+{best['recompute_flops'] / baseline_flops:.1%}")
        print(f"| {budget / MiB:.2f} | {mine} | {theirs} |")
    worse = [b for b, plan, _, best, _ in table
             if best is not None and plan.measured_recompute_flops > best["recompute_flops"]]
    print("remat_opt recomputes no more than the best fitting hand-written alternative at every budget"
          if not worse else f"remat_opt recomputes more at {[round(b / MiB, 2) for b in worse]} MiB")
    grads_ok = all(r["grad_error_over_tolerance"] <= 1 for r in rows if r["strategy"] == "remat_opt")
    print("gradients equal jax.grad (rtol 1e-5, atol 1e-6) at every budget" if grads_ok
          else "gradients differ from jax.grad beyond rtol 1e-5, atol 1e-6")
    return 0 if grads_ok and not worse and all(p.measured_peak_bytes <= b for b, p, *_ in table) else 1


if __name__ == "__main__":
    sys.exit(main())
