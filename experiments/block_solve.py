"""Solve time against depth: the block decomposition beside the whole-graph CP-SAT and Checkmate's MILP.

For the zoo GPT unrolled at 2 to 64 layers (d_model 64, 2 heads, seq 32,
batch 2, vocab 64: the sizes of ``solve_time.py``) the gradient step's graph
is built and planned at one budget per depth, ``--share`` of the plain
program's modelled peak (0.806 is ``solve_time.py``'s budget at 8 layers):

* ``blocks``: :func:`remat_opt.solve._solve.solve` with the whole-graph model
  off: block detection, the block's options (CP-SAT), the chain's dynamic
  program; its plan checked by the simulator (planning model).
* ``blocks+cp-sat``: the same, then the whole-graph CP-SAT model hinted with
  it (the default of ``solve``); its bound is the full model's bound, so its
  gap is the decomposition's plan against the full model's bound.
* ``cp-sat``: the whole-graph model alone, started from Chen's segmentations
  (what ``solve`` did before).
* Checkmate's MILP (SCIP), where its variables fit ``--milp-max-vars``; its
  memory model differs, so compare times and statuses only (``solve_time.py``).

The whole-graph solves run up to ``--whole-max-layers``; each gets the
deterministic limit ``--dtime`` and the wall-clock cap ``--time-limit``.

Usage:
    python experiments/block_solve.py [--layers 2 4 8 16 32 64] [--whole-max-layers 16]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, stamp, write_csv

from remat_opt._schedule import Schedule
from remat_opt.memory import model_graph
from remat_opt.memory import abstract
from remat_opt.memory import simulate
from remat_opt.program import trace
from remat_opt.solve._block_solve import _search_of
from checkmate_reference import (  # noqa: E402
    from_program_graph,
    simulate_stages,
    solve_checkmate,
    store_all,
)
from remat_opt.solve import SolverOptions, solve
from remat_opt.zoo import MODELS, GPTConfig


def gpt_graph(layers: int):
    spec = MODELS["gpt"]
    config = GPTConfig(num_layers=layers, d_model=64, num_heads=2, seq_len=32, batch=2, vocab=64)
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    return model_graph(trace(spec.loss, abstract((params, batch)), {}, (0,)))


def solved(graph, budget: int, options: SolverOptions, prefix: str) -> dict:
    start = time.perf_counter()
    sol = solve(graph, budget, options)
    seconds = time.perf_counter() - start
    sim = simulate(graph, sol.schedule, planning=True)
    assert sim.peak_bytes <= budget and sim.recompute_flops == sol.objective_flops, f"{prefix}: plan fails the model"
    return {f"{prefix}_method": sol.method, f"{prefix}_status": sol.status, f"{prefix}_recompute": sol.objective_flops,
            f"{prefix}_bound": round(sol.bound_flops), f"{prefix}_gap": round(sol.gap, 4),
            f"{prefix}_seconds": round(seconds, 2)}


def milp(graph, budget: int, limit: float, max_vars: int) -> dict:
    cg = from_program_graph(graph)
    row = {"milp_vars": cg.num_variables()}
    if cg.num_variables() > max_vars:
        return {**row, "milp_status": "SKIPPED", "milp_seconds": math.nan}
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    base = graph.input_bytes + graph.output_bytes
    full = simulate_stages(cg, *store_all(cg))[0]
    share = (budget - base) / (plain - base)
    res = solve_checkmate(cg, int(cg.base_bytes + share * (full - cg.base_bytes)), time_limit_s=limit, num_threads=2)
    return {**row, "milp_status": res.status, "milp_seconds": round(res.build_seconds + res.solve_seconds, 2)}


def measure(layers: int, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    graph = gpt_graph(layers)
    row = {"model": f"gpt-{layers}", "equations": graph.num_positions, "units": len(graph.units),
           "graph_seconds": round(time.perf_counter() - started, 2)}
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    budget = int(args.share * plain)
    row.update(plain_peak=plain, budget=budget)
    # The first solve finds the blocks and their options too: its time is all of it.
    row.update(solved(graph, budget, SolverOptions(num_workers=2, whole_graph=False), "blocks"))
    search = _search_of(graph)
    if search is not None:
        row.update(blocks=search.chain.count, block_length=search.chain.length, stages=search.costs.num_stages)
    options = SolverOptions(time_limit_s=args.time_limit, deterministic_time_limit=args.dtime, num_workers=2)
    if layers <= args.whole_max_layers:
        if search is not None:
            row.update(solved(graph, budget, options, "hinted"))
        row.update(solved(graph, budget, SolverOptions(**{**options.__dict__, "blocks": False}), "cpsat"))
    row.update(milp(graph, budget, args.time_limit, args.milp_max_vars))
    return row


def _cell(row: dict, key: str, fmt: str = "{:,}") -> str:
    return fmt.format(row[key]) if key in row else "—"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--share", type=float, default=0.806, help="budget as a share of the plain modelled peak")
    parser.add_argument("--whole-max-layers", type=int, default=16)
    parser.add_argument("--dtime", type=float, default=10.0, help="CP-SAT deterministic limit (whole graph)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="wall-clock cap per whole-graph solve")
    parser.add_argument("--milp-max-vars", type=int, default=200_000)
    parser.add_argument("--out", default=str(RESULTS / "block_solve.csv"))
    args = parser.parse_args(argv)
    rows = []
    for layers in args.layers:
        rows.append(measure(layers, args))
        print(rows[-1], file=sys.stderr, flush=True)
        write_csv(Path(args.out), rows, f"{stamp()}\n{command()}")
    print("| model | eqns | blocks | blocks: s | recompute | +cp-sat: s | recompute | gap (full bound) "
          "| cp-sat alone: s | recompute | gap | MILP |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        cell = functools.partial(_cell, r)
        print(f"| {r['model']} | {r['equations']} | {r.get('blocks', '—')} | "
              f"{cell('blocks_seconds', '{:.1f}')} | {cell('blocks_recompute')} | {cell('hinted_seconds', '{:.1f}')} | "
              f"{cell('hinted_recompute')} | {cell('hinted_gap', '{:.1%}')} | {cell('cpsat_seconds', '{:.1f}')} | "
              f"{cell('cpsat_recompute')} | {cell('cpsat_gap', '{:.1%}')} | {r['milp_status']} |")
    print(f"\n{stamp()}\nReproduce: {command()}")
    return rows


if __name__ == "__main__":
    main()
