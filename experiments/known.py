"""Optimal where the answer is known: remat_opt against every hand-written keep-set plan.

Each generated program (``tests/known_programs.draw``: chains and DAGs of 2 to 8
matmuls, widths and input widths drawn apart) has every keep-set plan (a fenced
segment per matmul, a subset of the matmuls' outputs saved by name, the rest
recomputed) measured on XLA. At each budget where the best fitting keep-set
changes (the peaks of the keep-sets' Pareto front under the plain peak),
``remat_opt.optimize(..., cache=False)`` is asked, budgets ascending, in one
process: its plan must fit, its gradients match ``jax.grad``, it must recompute
no more than the best keep-set that fits (1% slack), and across a program's
budgets a larger budget never costs more recompute.

Seeds: ``--seeds dev`` (``DEV_SEEDS``, looked at while the planner changed) or
``eval`` (``EVAL_SEEDS``, held out), the first ``--programs`` of them, stopping
after ``--minutes``; ``--budgets N`` takes at most N of a program's front budgets,
spread from its lowest to its highest (on 2 cores the full set takes hours).
One row per budget to ``<out>/known_<seeds>.csv``.

Usage:
    PYTHONPATH=src python experiments/known.py --seeds dev --programs 200
    PYTHONPATH=src python experiments/known.py --seeds eval --budgets 4 --minutes 30
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import RESULTS, command, stamp, write_csv  # noqa: E402
from known_programs import DEV_SEEDS, EVAL_SEEDS, answers, draw, enumerate_keep_sets, monotone, \
    pareto_budgets  # noqa: E402

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
    parser.add_argument("--seeds", choices=("dev", "eval"), default="dev")
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--first", type=int, default=0, help="skip this many seeds of the range")
    parser.add_argument("--minutes", type=float, default=float("inf"))
    parser.add_argument("--budgets", type=int, default=0,
                        help="at most this many budgets per program, spread over its front (0: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    a = parser.parse_args()
    seeds = list(DEV_SEEDS if a.seeds == "dev" else EVAL_SEEDS)[a.first:a.first + a.programs]
    path = a.out / f"known_{a.seeds}.csv"
    rows: list[dict] = []
    started = time.perf_counter()
    programs = 0
    for seed in seeds:
        if time.perf_counter() - started > a.minutes * 60:
            break
        program = draw(seed)
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
                         "budget": ans.budget, "peak": ans.peak, "fits": ans.fits,
                         "grad_error": f"{ans.grad_error:.2g}", "flops": ans.flops, "best_flops": ans.best_flops,
                         "best_kept": " ".join(map(str, ans.best_kept)), "no_worse": ans.no_worse,
                         "predicted": ans.predicted,
                         "prediction_error": "" if ans.prediction_error is None else f"{ans.prediction_error:+.3f}",
                         "monotone": mono, "enumerate_s": f"{enum_s:.1f}"})
        worse = sum(not a.no_worse for a in found)
        print(f"seed {seed} {program!r}: {len(keep_sets)} keep-sets, {len(budgets)} budgets, "
              f"{worse} worse, monotone {mono}, {time.perf_counter() - t:.0f}s", flush=True)
        write_csv(path, rows, f"{stamp()}; {command()}")
    n = len(rows)
    print(f"{programs} programs, {n} budgets: fit {sum(r['fits'] for r in rows)}, "
          f"no worse {sum(r['no_worse'] for r in rows)}, "
          f"monotone programs {len({r['seed'] for r in rows if r['monotone']})}/{len({r['seed'] for r in rows})}, "
          f"max grad error {max((float(r['grad_error']) for r in rows), default=0):.2g}; "
          f"{(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
