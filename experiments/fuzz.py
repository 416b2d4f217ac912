"""Generated programs at scale: the properties of tests/test_fuzz.py on 1000+ programs.

Each program is drawn with a seed (``tests/fuzz_programs.draw_program``: up to six
ops of dots, elementwise functions, reductions, reshapes, softmax/layernorm,
``lax.cond``, ``lax.scan``, custom_jvp/custom_vjp, an integer side input; float32
or bfloat16; dict, list or NamedTuple weights), its budget a seeded fraction of
its plain peak, from below the lowest reachable to above the peak as written.
``fuzz_programs.check`` then optimizes it twice (``cache=False``) and checks:
the optimized step's XLA peak is within the budget, or the InfeasibleBudgetError's
``min_budget_bytes`` is confirmed by a plan at that budget; gradients equal
``jax.grad``'s; the two runs agree; nothing else is raised. Then CP-SAT's optimum
is compared with exhaustive search on generated graphs small enough to enumerate
(``fuzz_programs.brute_force_agrees``), until ``--graphs`` of them were compared.

One row per program or graph goes to ``<out>/fuzz.csv``, rewritten every 25
rows (a run stopped early keeps what it did), stamped with the jax version and
the machine. The totals and the wall time are printed at the end. XLA's
executables are cached on disk for the run (the second run of each check
compiles the same programs), in a temporary folder unless
``JAX_COMPILATION_CACHE_DIR`` names one.

Usage:
    PYTHONPATH=src python experiments/fuzz.py                  # 1000 programs, 200 graphs
    PYTHONPATH=src python experiments/fuzz.py --programs 20 --graphs 10 --out /tmp/fuzz
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import RESULTS, command, stamp, write_csv  # noqa: E402
from fuzz_programs import FAST_SOLVER, brute_force_agrees, check, draw_program, graph_of  # noqa: E402

FRACTIONS = (0.3, 0.5, 0.7, 0.85, 0.95, 1.0, 1.2)
"""Budgets, as a fraction of the plain peak (the same as the tests' ``budget_fractions``)."""


def program_row(seed: int) -> dict:
    program = draw_program(seed)
    fraction = random.Random(~seed).choice(FRACTIONS)
    started = time.perf_counter()
    outcome = check(program, fraction)
    row = {"kind": "program", "seed": seed, "ops": " ".join(op.kind for op in program.ops),
           "dtype": program.dtype, "container": program.container, "argnums": program.argnums,
           "fraction": fraction, "budget": outcome.budget, "plain_peak": outcome.plain_peak,
           "outcome": outcome.outcome, "peak": outcome.peak, "grad_error": f"{outcome.grad_error:.3g}",
           "deterministic": outcome.deterministic, "min_confirmed": outcome.min_confirmed, "ok": outcome.ok,
           "seconds": f"{time.perf_counter() - started:.2f}", "detail": outcome.detail.replace("\n", " ")}
    if not outcome.ok:
        print(f"FAILED seed {seed}, fraction {fraction}: {outcome}\n{program!r}", flush=True)
    return row


def graph_rows(count: int, first_seed: int) -> list[dict]:
    """Brute force against CP-SAT on ``count`` generated graphs that can be enumerated."""
    rows, seed = [], first_seed
    while len(rows) < count:
        program = draw_program(seed, max_ops=3, tail="sum")
        fraction = random.Random(~seed).choice(FRACTIONS)
        graph = graph_of(program, scale=1.0 + fraction / 4)
        started = time.perf_counter()
        agrees = brute_force_agrees(graph)
        if agrees is not None:
            rows.append({"kind": "brute_force", "seed": seed, "ops": " ".join(op.kind for op in program.ops),
                         "dtype": program.dtype, "positions": graph.num_positions, "outcome": "compared",
                         "ok": agrees, "seconds": f"{time.perf_counter() - started:.2f}"})
            if not agrees:
                print(f"BRUTE FORCE DISAGREES seed {seed}\n{program!r}", flush=True)
        seed += 1
    return rows


def totals(rows: list[dict]) -> str:
    programs = [r for r in rows if r["kind"] == "program"]
    graphs = [r for r in rows if r["kind"] == "brute_force"]
    count = lambda pred: sum(1 for r in programs if pred(r))  # noqa: E731
    return "\n".join([
        f"programs run: {len(programs)} (plans {count(lambda r: r['outcome'] == 'plan')}, "
        f"infeasible budgets {count(lambda r: r['outcome'] == 'infeasible')})",
        f"wrong gradients: {count(lambda r: float(r['grad_error']) > 1.0)}",
        f"budget misses: {count(lambda r: r['outcome'] == 'plan' and r['peak'] > r['budget'])}",
        f"unconfirmed minimum budgets: {count(lambda r: not r['min_confirmed'])}",
        f"unexpected exceptions: {count(lambda r: r['outcome'] == 'exception')}",
        f"nondeterministic plans: {count(lambda r: not r['deterministic'])}",
        f"brute-force graphs: {len(graphs)}, CP-SAT optimum different from brute force: "
        f"{sum(1 for r in graphs if not r['ok'])}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--graphs", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    jax.config.update("jax_compilation_cache_dir",
                      os.environ.get("JAX_COMPILATION_CACHE_DIR") or tempfile.mkdtemp(prefix="fuzz_xla_"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    header = f"{stamp()}\nreproduce: PYTHONPATH=src {command()}\nsolver: {FAST_SOLVER}"
    print(header, flush=True)
    path, rows, started = args.out / "fuzz.csv", [], time.perf_counter()
    rows += graph_rows(args.graphs, args.first_seed)
    print(f"{args.graphs} brute-force graphs in {time.perf_counter() - started:.0f} s", flush=True)
    for seed in range(args.first_seed, args.first_seed + args.programs):
        rows.append(program_row(seed))
        if len(rows) % 25 == 0:
            write_csv(path, rows, f"{header}\npartial: {len(rows)} rows, {time.perf_counter() - started:.0f} s")
            print(f"{seed - args.first_seed + 1} programs, {time.perf_counter() - started:.0f} s", flush=True)
    wall = time.perf_counter() - started
    write_csv(path, rows, f"{header}\nwall time {wall:.0f} s")
    print(f"\n{totals(rows)}\nwall time {wall / 60:.1f} min; {stamp()}\nwrote {path}", flush=True)


if __name__ == "__main__":
    main()
