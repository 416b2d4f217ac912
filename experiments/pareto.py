"""Pareto fronts: XLA-measured peak against recompute overhead, every strategy.

Checkmate's Figure 4, measured on the compiler: for each zoo model, remat_opt
is run at a sweep of budgets from the smallest it can reach (the
``min_budget_bytes`` of the :class:`remat_opt.InfeasibleBudgetError` raised at a
one-byte budget) to the plain peak, and, to compare like with like, at every
baseline's own measured peak. Each baseline of :func:`remat_opt.all_baselines`
(JAX's policies around the whole loss and around each layer, Megatron-style
selective recompute, Chen's sqrt(n) and greedy segments, no remat) is one point.

Recompute overhead is counted on each program's jaxpr (FLOPs beyond the plain
gradient's), and optionally as the median wall time of the jitted step
(``--time``). A baseline is *dominated* when remat_opt, given that baseline's
measured peak as its budget, fits it with no more recompute FLOPs.

Writes ``results/pareto.csv`` (one row per point, with the model's config and,
for a plan on the program graph, its schedule as JSON: ``fidelity.py`` reads
it, and re-predicts the stored schedules with ``--repredict`` after a model
change) and ``results/pareto.png``, stamped with the jax version and machine.

Usage:
    python experiments/pareto.py [--models mlp,resnet,unet,gpt] [--budgets 6] [--time]
    python experiments/pareto.py --quick [--models mlp]   # small configs, two budgets (the tests: mlp)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax

import remat_opt
from remat_opt.zoo import MODELS, GPTConfig, MLPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, mib, stamp, step_seconds, write_csv  # noqa: E402

QUICK_CONFIGS = {
    "mlp": MLPConfig(depth=6, width=64, batch=256),
    "gpt": GPTConfig(num_layers=2, d_model=32, num_heads=2, seq_len=32, batch=2, vocab=64),
}
QUICK_POLICIES = ("nothing_saveable",)
VERDICT = {True: "yes", False: "NO", None: "not run"}


def program_of(spec, plan: remat_opt.Plan, params, batch):
    """The program a baseline plan measured, rebuilt to time it."""
    from remat_opt.memory import model_graph
    from remat_opt.memory import abstract
    from remat_opt.rewrite import apply_schedule
    from remat_opt.rewrite import layer_policy_program, policy_program
    from remat_opt.program import trace

    kind, _, policy = plan.strategy.partition("/")
    if kind == "no_remat":
        return spec.loss
    if kind == "checkpoint":
        return policy_program(spec.loss, policy)
    if kind == "layer_checkpoint":
        return layer_policy_program(spec.loss, policy)
    if kind == "megatron_selective":
        return layer_policy_program(spec.loss, "dots_with_no_batch_dims_saveable")
    graph = model_graph(trace(spec.loss, abstract((params, batch)), {}, (0,)))
    return apply_schedule(spec.loss, graph, plan.schedule)


def min_budget(loss, params, batch, options: remat_opt.SolverOptions) -> int:
    """The smallest budget remat_opt can meet on XLA for this model: the minimum its search names.
    One byte is under the step's arguments and outputs, refused before any search with those
    bytes (``lower_bound``); the search runs at them."""
    budget = 1
    for _ in range(2):
        try:
            remat_opt.optimize(loss, budget, solver_options=options).plan(params, batch)
        except remat_opt.InfeasibleBudgetError as err:
            if not err.lower_bound:
                return err.min_budget_bytes
            budget = err.min_budget_bytes
        else:
            return budget
    raise AssertionError("a budget under the step's arguments and outputs was refused twice")


def row(model: str, config, plan: remat_opt.Plan, kind: str, seconds: float | None) -> dict:
    flops = plan.measured_recompute_flops if plan.measured_recompute_flops is not None else plan.recompute_flops
    return {
        "model": model,
        "strategy": plan.strategy,
        "kind": kind,
        "budget_bytes": plan.budget_bytes,
        "measured_peak_bytes": plan.measured_peak_bytes,
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "plain_peak_bytes": plan.plain_peak_bytes,
        "recompute_flops": flops,
        "model_recompute_flops": plan.recompute_flops,
        "baseline_flops": plan.baseline_flops,
        "overhead": flops / plan.baseline_flops,
        "step_seconds": seconds,
        "status": plan.status,
        "gap": plan.gap,
        "solve_seconds": plan.solve_seconds,
        "error": "",
        "config": json.dumps(dataclasses.asdict(config)),
        "schedule": plan.schedule.to_json() if plan.schedule is not None else "",
    }


def run_model(name: str, config, budgets: int, policies, options, timed: bool, quick: bool = False) -> list[dict]:
    spec = MODELS[name]
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    args = (params, batch)
    plain = remat_opt.peak_bytes(spec.loss, *args)
    print(f"\n## {name}: {config}\nplain peak {plain / MiB:.2f} MiB", flush=True)
    rows = []
    call = remat_opt.BaselineCall(spec.loss, (params, batch), budget_bytes=plain)
    for plan in remat_opt.all_baselines(call, policies=policies):
        seconds = step_seconds(program_of(spec, plan, params, batch), args) if timed else None
        rows.append(row(name, config, plan, "baseline", seconds))
        print(f"  {plan.strategy:45s} peak {plan.measured_peak_bytes / MiB:8.2f} MiB  "
              f"+{rows[-1]['overhead']:.1%} FLOPs", flush=True)
    lowest = min_budget(spec.loss, params, batch, options)
    sweep = [int(lowest + (plain - lowest) * i / max(1, budgets - 1)) for i in range(budgets)]
    # remat_opt at each baseline's peak too (pareto_dominance.csv), except in a quick run.
    at_baselines = set() if quick else {r["measured_peak_bytes"] for r in rows if r["measured_peak_bytes"] < plain}
    for budget in sorted(set(sweep) | at_baselines):
        kind = "sweep" if budget in sweep else "at_baseline"
        # Solved even below ``lowest``: that minimum is what XLA measured for the
        # schedules the model ranks lowest, and at a given budget optimize also
        # measures those the model puts near it (ResNet: Chen greedy's peak is 88
        # bytes under it, and optimize fits it there).
        step = remat_opt.optimize(spec.loss, budget, solver_options=options)
        try:
            plan = step.plan(params, batch)
        except remat_opt.RematOptError as err:
            print(f"  remat_opt at {budget / MiB:8.2f} MiB: {type(err).__name__}: {err}", flush=True)
            rows.append({"model": name, "strategy": "remat_opt", "kind": kind, "budget_bytes": budget,
                         "error": type(err).__name__})
            continue
        seconds = step_seconds(step, args) if timed else None
        rows.append(row(name, config, plan, kind, seconds))
        print(f"  remat_opt budget {budget / MiB:8.2f} MiB  peak {plan.measured_peak_bytes / MiB:8.2f} "
              f"(predicted {mib(plan.predicted_peak_bytes):>8})  +{rows[-1]['overhead']:.1%} FLOPs  "
              f"{plan.status} {plan.solve_seconds:.0f}s", flush=True)
    return rows


def dominance(rows: list[dict]) -> list[dict]:
    """For each baseline below the plain peak: remat_opt at its peak, and who wins."""
    out = []
    for b in (r for r in rows if r["kind"] == "baseline"):
        if b["measured_peak_bytes"] >= b["plain_peak_bytes"]:
            continue
        mine = [r for r in rows if r["strategy"] == "remat_opt" and r["model"] == b["model"]
                and r["budget_bytes"] == b["measured_peak_bytes"]]
        ours = mine[0] if mine else None
        fits = ours is not None and not ours.get("error")
        out.append({
            "model": b["model"], "baseline": b["strategy"], "peak_MiB": b["measured_peak_bytes"] / MiB,
            "baseline_overhead": b["overhead"],
            "remat_opt_peak_MiB": ours["measured_peak_bytes"] / MiB if fits else None,
            "remat_opt_overhead": ours["overhead"] if fits else None,
            # None where remat_opt was not run at this peak (a quick run).
            "remat_opt_no_worse": (fits and ours["overhead"] <= b["overhead"] + 1e-12) if mine else None,
        })
    return out


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = sorted((r for r in rows if r["model"] == model and r["strategy"] == "remat_opt" and not r.get("error")),
                      key=lambda r: r["measured_peak_bytes"])
        ax.plot([100 * r["overhead"] for r in mine], [r["measured_peak_bytes"] / MiB for r in mine],
                "o-", color="black", label="remat_opt", zorder=3)
        for r in (r for r in rows if r["model"] == model and r["kind"] == "baseline"):
            ax.scatter(100 * r["overhead"], r["measured_peak_bytes"] / MiB, label=r["strategy"], s=30, alpha=0.8)
        plain = next(r["plain_peak_bytes"] for r in rows if r["model"] == model and r.get("plain_peak_bytes"))
        ax.axhline(plain / MiB, color="gray", lw=0.8, ls="--")
        ax.set_title(model)
        ax.set_xlabel("recompute overhead (% of plain gradient FLOPs)")
        ax.set_ylabel("XLA peak (MiB)")
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo models (default: mlp,resnet,unet,gpt; "
                                         "with --quick: mlp,gpt, at small configs)")
    parser.add_argument("--budgets", type=int, default=6, help="sweep points from the minimum to the plain peak")
    parser.add_argument("--time", action="store_true", help="also time each jitted step (median of 5)")
    parser.add_argument("--time-limit", type=float, default=remat_opt.SolverOptions.time_limit_s,
                        help="CP-SAT wall-clock cap per solve, a safety net above the deterministic limit"
                             " (a solve the wall clock stops depends on the load)")
    parser.add_argument("--quick", action="store_true",
                        help="small models, two budgets, one policy, none at the baselines' peaks")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(QUICK_CONFIGS if args.quick else MODELS)
    if args.quick and not set(names) <= set(QUICK_CONFIGS):
        parser.error(f"--quick has small configs of {', '.join(QUICK_CONFIGS)} only, not of {args.models}")
    budgets = 2 if args.quick else args.budgets
    policies = QUICK_POLICIES if args.quick else tuple(remat_opt.POLICIES)
    options = remat_opt.SolverOptions(time_limit_s=60 if args.quick else args.time_limit,
                                      deterministic_time_limit=1 if args.quick else 10.0,
                                      num_workers=2 if args.quick else 8)
    header = f"{stamp()}\nreproduce: {command()}"
    print(header)
    start = time.perf_counter()
    rows = []
    for name in names:
        config = QUICK_CONFIGS[name] if args.quick else MODELS[name].default_config
        rows += run_model(name, config, budgets, policies, options, args.time, args.quick)
        write_csv(args.out / "pareto.csv", rows, header)  # after each model: a long run keeps what it did
    wins = dominance(rows)
    write_csv(args.out / "pareto_dominance.csv", wins, header)
    plot(rows, args.out / "pareto.png", header)
    print("\n| model | baseline | its peak MiB | its overhead | remat_opt peak MiB | remat_opt overhead | no worse |")
    print("|---|---|---:|---:|---:|---:|---|")
    for w in wins:
        ours = "—" if w["remat_opt_peak_MiB"] is None else f"{w['remat_opt_peak_MiB']:.2f}"
        ours_o = "—" if w["remat_opt_overhead"] is None else f"{w['remat_opt_overhead']:+.1%}"
        print(f"| {w['model']} | {w['baseline']} | {w['peak_MiB']:.2f} | {w['baseline_overhead']:+.1%} | "
              f"{ours} | {ours_o} | {VERDICT[w['remat_opt_no_worse']]} |")
    print(f"\nwrote {args.out / 'pareto.csv'}, pareto_dominance.csv, pareto.png in {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
