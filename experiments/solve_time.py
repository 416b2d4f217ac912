"""Solve time as graphs grow: remat_opt's CP-SAT model against Checkmate's MILP.

For zoo MLPs (2–32 layers) and GPTs (1–8 blocks) the gradient step is traced
and its graph built (:func:`remat_opt.program._graph.build_graph`). remat_opt's budget
is 60% of the way from the lowest peak its model reaches
(:func:`remat_opt.solve._solve.min_peak_schedule`) to the peak without remat
(``Schedule(plain=True)``); :func:`remat_opt.solve._solve.solve` is timed at it.

Checkmate's MILP (experiments/checkmate_reference.py, solved by SCIP by default) runs
on Checkmate's own forward + backward graph of the same program, whose memory
model differs (every value materialized, no transients). It gets the budget at
the same *relative* place: the same fraction of its no-recompute activation
bytes (``store_all``) above the fixed ``base_bytes`` as remat_opt's budget has
of the plain program's. Models above ``--max-vars`` variables are skipped (the
MILP has O(n²) of them). Both solvers get the same wall-clock limit; CP-SAT's
deterministic limit is lifted so that the wall clock binds. Every plan is
re-checked by its model's own simulator. The two objectives are recompute
FLOPs in two different models: compare times and statuses, not values.

Writes ``solve_time.csv`` and ``solve_time.png`` (time vs. primal equations,
log scale; ``solve_time_<backend>.*`` for another MILP backend) under
``experiments/results/`` and prints a markdown table.

Usage:
    python experiments/solve_time.py [--time-limit 60] [--workers 2] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import jax

from remat_opt._errors import InfeasibleBudgetError
from remat_opt.memory import model_graph
from remat_opt.memory import abstract
from remat_opt.memory import simulate
from remat_opt._schedule import Schedule
from remat_opt.solve import SolverOptions, min_peak_schedule, solve
from remat_opt.program import trace
from remat_opt.zoo import MODELS, GPTConfig, MLPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkmate_reference import from_program_graph, simulate_stages, solve_checkmate, store_all  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FRACTION = 0.6  # of the way from the lowest peak to the plain peak


def sizes(quick: bool) -> list[tuple[str, str, object]]:
    mlp = [("mlp", f"mlp-{d}", MLPConfig(depth=d, width=128, batch=64)) for d in (2, 4, 8, 16, 32)]
    gpt = [("gpt", f"gpt-{n}", GPTConfig(num_layers=n, d_model=64, num_heads=2, seq_len=32, batch=2, vocab=64))
           for n in (1, 2, 4, 8)]
    return mlp[:2] if quick else mlp + gpt


def measure(family: str, label: str, config: object, limit: float, workers: int, max_vars: int,
            backend: str) -> dict:
    """One row: the graph's size, the budgets, and both solvers' verdicts."""
    spec = MODELS[family]
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    graph = model_graph(trace(spec.loss, abstract((params, batch)), {}, (0,)))
    options = SolverOptions(time_limit_s=limit, deterministic_time_limit=1e9, num_workers=workers)
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    lowest = simulate(graph, min_peak_schedule(graph, options)).peak_bytes
    budget = int(lowest + FRACTION * max(0, plain - lowest))
    base = graph.input_bytes + graph.output_bytes
    row = {"model": label, "equations": graph.num_positions, "units": len(graph.units),
           "plain_peak": plain, "lowest_peak": lowest, "budget": budget}

    start = time.perf_counter()
    try:
        sol = solve(graph, budget, options)
        assert simulate(graph, sol.schedule).peak_bytes <= budget, "CP-SAT plan over budget"
        row.update(cpsat_status=sol.status, cpsat_recompute=sol.objective_flops, cpsat_gap=sol.gap,
                   cpsat_seconds=sol.solve_seconds)
    except InfeasibleBudgetError:
        row.update(cpsat_status="INFEASIBLE", cpsat_recompute=math.nan, cpsat_gap=math.nan,
                   cpsat_seconds=time.perf_counter() - start)

    cg = from_program_graph(graph)
    full = simulate_stages(cg, *store_all(cg))[0]
    share = (budget - base) / (plain - base) if plain > base else 1.0
    cm_budget = int(cg.base_bytes + share * (full - cg.base_bytes))
    row.update(cm_ops=cg.size, cm_vars=cg.num_variables(), cm_store_all_peak=full, cm_budget=cm_budget)
    if cg.num_variables() > max_vars:
        row.update(milp_status="SKIPPED", milp_recompute=math.nan, milp_gap=math.nan,
                   milp_build_seconds=math.nan, milp_seconds=math.nan)
        return row
    res = solve_checkmate(cg, cm_budget, time_limit_s=limit, backend=backend, num_threads=workers)
    if res.feasible:
        peak, cost = simulate_stages(cg, res.compute, res.keep)
        assert peak <= cm_budget and cost == res.recompute_cost, "Checkmate plan fails its simulator"
    row.update(milp_status=res.status, milp_recompute=res.recompute_cost, milp_gap=res.gap,
               milp_build_seconds=res.build_seconds, milp_seconds=res.solve_seconds)
    return row


def plot(rows: list[dict], path: Path, stamp: str, limit: float, backend: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for family, marker in (("mlp", "o"), ("gpt", "s")):
        fam = [r for r in rows if r["model"].startswith(family)]
        for key, color, name in (("cpsat", "tab:blue", "remat_opt CP-SAT"), ("milp", "tab:red", f"Checkmate MILP ({backend})")):
            pts = [(r["equations"], r[f"{key}_seconds"], r[f"{key}_status"]) for r in fam
                   if not math.isnan(r[f"{key}_seconds"])]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [max(p[1], 1e-3) for p in pts], color=color, marker=marker,
                    markerfacecolor="none", label=f"{name}, {family}")
            done = [p for p in pts if p[2] in ("OPTIMAL", "INFEASIBLE")]
            ax.scatter([p[0] for p in done], [max(p[1], 1e-3) for p in done], color=color, marker=marker)
    skipped = [r["equations"] for r in rows if r["milp_status"] == "SKIPPED"]
    if skipped:
        ax.scatter(skipped, [limit] * len(skipped), color="tab:red", marker="x", label="MILP skipped (size)")
    ax.axhline(limit, color="gray", linestyle=":", label=f"time limit {limit:g} s")
    ax.set(xscale="log", yscale="log", xlabel="primal equations in the gradient step",
           ylabel="solve wall time (s)", title="Solve time (filled: proven optimal or infeasible)")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    fig.text(0.01, 0.01, stamp, fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=None, help="seconds per solve (60; 10 with --quick)")
    parser.add_argument("--workers", type=int, default=2, help="CP-SAT workers and MILP threads")
    parser.add_argument("--max-vars", type=int, default=1_000_000, help="skip larger MILPs")
    parser.add_argument("--backend", default="SCIP", help="MILP solver: SCIP, CBC or HIGHS")
    parser.add_argument("--quick", action="store_true", help="two tiny MLPs, 10 s limit")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    limit = args.time_limit or (10.0 if args.quick else 60.0)
    stamp = f"jax {jax.__version__}; {platform.platform()}; limit {limit:g} s; {args.workers} workers"
    rows = []
    for family, label, config in sizes(args.quick):
        rows.append(measure(family, label, config, limit, args.workers, args.max_vars, args.backend))
        print(f"  {label}: CP-SAT {rows[-1]['cpsat_status']} {rows[-1]['cpsat_seconds']:.2f} s, "
              f"MILP {rows[-1]['milp_status']} {rows[-1]['milp_seconds']:.2f} s", file=sys.stderr, flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "solve_time" if args.backend == "SCIP" else f"solve_time_{args.backend.lower()}"
    with open(args.out_dir / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*rows[0], "stamp"])
        writer.writeheader()
        writer.writerows({**r, "stamp": stamp} for r in rows)
    plot(rows, args.out_dir / f"{stem}.png", stamp, limit, args.backend)
    print(f"| model | equations | Checkmate ops | MILP vars | CP-SAT | s | gap | MILP ({args.backend}) | s | gap |")
    print("|---|---:|---:|---:|---|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['equations']} | {r['cm_ops']} | {r['cm_vars']:,} | {r['cpsat_status']} "
              f"| {r['cpsat_seconds']:.2f} | {r['cpsat_gap']:.3g} | {r['milp_status']} "
              f"| {r['milp_seconds']:.2f} | {r['milp_gap']:.3g} |")
    print(f"\n{stamp}\nReproduce: " + shlex.join(["python", "experiments/solve_time.py", *(argv or sys.argv[1:])]))
    return rows


if __name__ == "__main__":
    main()
