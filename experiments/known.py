"""Optimal where the answer is known: remat_opt against every hand-written keep-set plan.

Each generated program (``tests/known_programs.FAMILIES``: ``mixed``, chains and DAGs
of 2 to 8 matmuls, widths and input widths drawn apart; ``branches``, parallel
matmuls of one input, each a knapsack item) has every keep-set plan (a fenced
segment per matmul, a subset of the matmuls' outputs saved by name, the rest
recomputed) measured on XLA. At each budget where the best fitting keep-set
changes (the peaks of the keep-sets' Pareto front under the plain peak),
``remat_opt.optimize(..., cache=False)`` is asked, budgets ascending, in one
process: its plan must fit, its gradients match ``jax.grad``, it must recompute
no more than the best keep-set that fits (1% slack), and across a program's
budgets a larger budget never costs more recompute.

Seeds: ``--seeds dev`` (``DEV_SEEDS``, looked at while the planner changed) or
``eval`` (``EVAL_SEEDS``, held out; ``seeds_of`` moves the evaluation seeds that drove a
change to the development set and replaces each) or ``fresh`` (``FRESH_SEEDS``, a second held-out
set fixed in session 46) or ``range`` (seeds from ``--start``: a new held-out range, fixed
before it is first run, once the others are spent), the first ``--programs`` of them, stopping
after ``--minutes``; ``--budgets N`` takes at most N of a program's front budgets,
spread from its lowest to its highest, and ``--max-dots N`` (``--min-dots N``) skips the
programs of more (fewer) than N matmuls (2**N plans each): on 2 cores the full set takes days.
One row per budget to ``<out>/known_<family>_<seeds>.csv``.

Usage:
    PYTHONPATH=src python experiments/known.py --seeds dev --programs 200
    PYTHONPATH=src python experiments/known.py --seeds eval --budgets 4 --minutes 30
    python experiments/known.py --summary experiments/results/known_*.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import RESULTS, command, stamp, write_csv  # noqa: E402
from known_programs import FAMILIES, answers, enumerate_keep_sets, monotone, pareto_budgets, \
    seeds_of  # noqa: E402

import remat_opt  # noqa: E402


def spread(budgets: list[int], most: int) -> list[int]:
    """At most ``most`` of ``budgets`` (ascending), the lowest and the highest among them."""
    if most <= 0 or len(budgets) <= most:
        return budgets
    if most == 1:
        return budgets[:1]
    return sorted({budgets[round(i * (len(budgets) - 1) / (most - 1))] for i in range(most)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", choices=("dev", "eval", "fresh", "range"), default="dev")
    parser.add_argument("--start", type=int, default=30_000,
                        help="with --seeds range: the first seed of a range fixed before it is run")
    parser.add_argument("--family", choices=tuple(FAMILIES), default="mixed")
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--first", type=int, default=0, help="skip this many seeds of the range")
    parser.add_argument("--minutes", type=float, default=float("inf"))
    parser.add_argument("--max-dots", type=int, default=8, help="skip the seeds' programs of more matmuls")
    parser.add_argument("--min-dots", type=int, default=2, help="skip the seeds' programs of fewer matmuls")
    parser.add_argument("--budgets", type=int, default=0,
                        help="at most this many budgets per program, spread over its front (0: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--summary", type=Path, nargs="*", help="only print the figures of these CSVs")
    a = parser.parse_args()
    if a.summary:
        return summarize(a.summary)
    if a.seeds == "range":
        seeds = list(range(a.start + a.first, a.start + a.first + a.programs))
    else:
        seeds = seeds_of(a.family, a.seeds == "eval", a.seeds == "fresh")[a.first:a.first + a.programs]
    path = a.out / f"known_{a.family}_{a.seeds}.csv"
    rows: list[dict] = []
    started = time.perf_counter()
    programs = 0
    for seed in seeds:
        if time.perf_counter() - started > a.minutes * 60:
            break
        program = FAMILIES[a.family](seed)
        if not a.min_dots <= len(program.dots) <= a.max_dots:
            continue
        params, x = program.args()
        plain = remat_opt.peak_bytes(program, params, x)
        t = time.perf_counter()
        keep_sets = enumerate_keep_sets(program)
        enum_s = time.perf_counter() - t
        budgets = spread(pareto_budgets(keep_sets, plain), a.budgets)
        found = answers(program, keep_sets, budgets)
        mono = monotone(found)
        programs += 1
        for ans in found:
            rows.append({"seed": seed, "program": repr(program), "dots": len(program.dots), "plain_peak": plain,
                         "budget": ans.budget, "peak": ans.peak, "fits": ans.fits, "refused": ans.refused,
                         "grad_error": f"{ans.grad_error:.2g}", "flops": ans.flops, "best_flops": ans.best_flops,
                         "best_kept": " ".join(map(str, ans.best_kept)), "no_worse": ans.no_worse,
                         "predicted": ans.predicted,
                         "prediction_error": "" if ans.prediction_error is None else f"{ans.prediction_error:+.3f}",
                         "monotone": mono, "enumerate_s": f"{enum_s:.1f}"})
        worse = sum(not a.no_worse for a in found)
        print(f"seed {seed} {program!r}: {len(keep_sets)} keep-sets, {len(budgets)} budgets, "
              f"{worse} worse, monotone {mono}, {time.perf_counter() - t:.0f}s", flush=True)
        write_csv(path, rows, f"{stamp()}; {command()}")
    print(f"{programs} programs; {summary(rows)}; {(time.perf_counter() - started) / 60:.1f} min")


def summary(rows: list[dict]) -> str:
    """The sweep's figures: budgets that fit, no worse than the best keep-set (1% slack),
    monotone programs, the largest gradient error, predictions within 10% of XLA."""
    true = lambda v: v in (True, "True")  # noqa: E731 - rows from this run or read back from a CSV
    # A program is its name (family and seed): the families draw from the same seed numbers.
    program = lambda r: r["program"].split(":")[0]  # noqa: E731
    programs = {program(r) for r in rows}
    errors = [abs(float(r["prediction_error"])) for r in rows if r["prediction_error"] not in ("", None)]
    return (f"{len(programs)} programs with budgets, {len(rows)} budgets: fit {sum(true(r['fits']) for r in rows)}, "
            f"no worse {sum(true(r['no_worse']) for r in rows)}, "
            f"monotone programs {len({program(r) for r in rows if true(r['monotone'])})}/{len(programs)}, "
            f"largest gradient error {max((float(r['grad_error']) for r in rows), default=0):.2g}, "
            f"predicted within 10% {sum(e <= 0.10 for e in errors)}/{len(errors)}")


def summarize(paths: list[Path]) -> None:
    """Prints :func:`summary` of the CSVs at ``paths``, chains and DAGs apart."""
    rows = [r for p in paths for r in csv.DictReader(line for line in p.open() if not line.startswith("#"))]
    print(f"all: {summary(rows)}")
    for family in ("chain", "dag", "branches"):
        print(f"{family}: {summary([r for r in rows if r['program'].startswith(f'KnownProgram({family}')])}")


if __name__ == "__main__":
    main()
