"""Does one call's measured candidate tell the next one's error? Within-call feedback, tried.

Each ``optimize`` call compiles several candidates before it returns a plan:
CP-SAT's schedules under a steered target, the lowest-memory schedules, the
outside tiers. If the model's error on a program were a property of the
program, the error XLA shows on one candidate would correct the prediction of
the next, and the returned plan's prediction would land within 5% of XLA's
figure (issue 21, item 1). This measures that on the development set
(``dev_programs.py``; no held-out program): for every plan ``optimize``
returns after another candidate was measured, the model's prediction as it
stands, and corrected by the candidate measured just before it, as an offset
(``predicted + measured' - predicted'``) and as a ratio
(``predicted * measured' / predicted'``).

The candidates are read from the planner's own log (``remat_opt`` logger,
INFO): each line that names a measured and a predicted peak, at the log's
two decimals of a MiB.

Usage:
    python experiments/lab/call_feedback.py [--programs lstm,random_dev_1000] [--fractions 0.8,0.6] [--out DIR]

Writes ``<out>/call_feedback.csv`` (one row per returned plan, with every candidate's
measured/predicted bytes in the call's order) and prints a summary.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

# run from experiments/lab/: common and dev_programs are in experiments/, one up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import RESULTS, command, stamp, write_csv  # noqa: E402
from dev_programs import DEV_PROGRAMS  # noqa: E402

import remat_opt  # noqa: E402

FRACTIONS = (0.8, 0.6, 0.4)
OPTIONS = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=2, seed=0)
_CANDIDATE = re.compile(r"measured(?: on XLA)?:? ([\d.]+ [KMG]?i?B)\b.*\(?predicted ([\d.]+ [KMG]?i?B)\)?")


class _Candidates(logging.Handler):
    """(measured, predicted) bytes of every candidate the planner logs, in order."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[int, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _CANDIDATE.search(record.getMessage())
        if found:
            self.seen.append((remat_opt.parse_bytes(found[1]), remat_opt.parse_bytes(found[2])))


def _returned(seen: list[tuple[int, int]], plan: remat_opt.Plan) -> int | None:
    """Where the returned plan is among the logged candidates (figures rounded to the log's)."""
    for k, (measured, predicted) in enumerate(seen):
        if abs(measured - plan.measured_peak_bytes) < 0.006 * measured and \
                abs(predicted - plan.predicted_peak_bytes) < 0.006 * predicted:
            return k
    return None


def call_row(name: str, fraction: float, program, plain: int) -> dict | None:
    """One ``optimize`` call: its plan's error as predicted and as corrected by the candidate before."""
    logger, handler = logging.getLogger("remat_opt"), _Candidates()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        plan = remat_opt.optimize(program.loss, int(fraction * plain), argnums=program.argnums,
                                  solver_options=OPTIONS, cache=False).plan(*program.args)
    except remat_opt.InfeasibleBudgetError:
        return None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    if plan.predicted_peak_bytes is None:
        return None  # a whole-function policy: the model does not describe it
    k = _returned(handler.seen, plan)
    row = {"program": name, "budget_fraction": fraction, "predicted_peak_bytes": plan.predicted_peak_bytes,
           "measured_peak_bytes": plan.measured_peak_bytes, "recompute_fraction": plan.recompute_overhead,
           "attempts": plan.attempts, "candidates_before": k,
           "candidates": ";".join(f"{m}/{p}" for m, p in handler.seen),  # measured/predicted, in order
           "error": plan.predicted_peak_bytes / plan.measured_peak_bytes - 1}
    if k:  # corrected by the candidate measured just before
        measured, predicted = handler.seen[k - 1]
        row["error_offset"] = (plan.predicted_peak_bytes + measured - predicted) / plan.measured_peak_bytes - 1
        row["error_ratio"] = plan.predicted_peak_bytes * measured / predicted / plan.measured_peak_bytes - 1
    print(f"  {name:18s} {fraction}: {row['error']:+.1%}, after {k} candidates"
          + (f"; offset {row['error_offset']:+.1%}, ratio {row['error_ratio']:+.1%}" if k else ""), flush=True)
    return row


def summary(rows: list[dict]) -> str:
    """Plans within 5% of XLA, as predicted and as corrected, over those with a candidate before."""
    after = [r for r in rows if r.get("error_offset") is not None]

    def within(key: str) -> int:
        return sum(abs(r[key]) <= 0.05 for r in after)

    return (f"{len(rows)} plans; {len(after)} returned after another candidate was measured. Of these, within 5% of "
            f"XLA: as predicted {within('error')}, offset-corrected {within('error_offset')}, "
            f"ratio-corrected {within('error_ratio')}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=lambda s: [p for p in s.split(",") if p], default=list(DEV_PROGRAMS))
    parser.add_argument("--fractions", type=lambda s: [float(f) for f in s.split(",") if f], default=FRACTIONS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for name in args.programs:
        program = DEV_PROGRAMS[name]()
        plain = remat_opt.peak_bytes(program.loss, *program.args, argnums=program.argnums)
        rows += [r for f in args.fractions if (r := call_row(name, f, program, plain)) is not None]
    print(summary(rows))
    write_csv(args.out / "call_feedback.csv", rows, f"{stamp()}; {command()}")


if __name__ == "__main__":
    main()
