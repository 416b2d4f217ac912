"""Development-set fidelity: the memory model on ``dev_programs.py``, measured once, re-predicted fast.

The development set is where a change to the model for a family the zoo
lacks (recurrent cells, conv nets in other layouts) is diagnosed and checked,
so that the held-out set (``heldout.py``) stays an evaluation set.
``collect`` measures, for each development program, the schedules
``schedule_fidelity.baseline_schedules`` picks (Chen's segmentations, a few
of Chen's greedy candidates, Revolve's trees the model ranks lowest) and
writes each schedule with XLA's peak to ``results/dev_fidelity.csv``.
``check`` re-predicts every row with the model as it is now, in seconds.
``live`` compiles every row again and sets the model's prediction beside
both of XLA's figures: the bytes it allocates (the peak the model predicts)
and the bytes live at its peak instruction (``remat_opt.fragmentation``),
written to ``results/dev_fidelity_live.csv``.

Usage:
    python experiments/lab/dev_fidelity.py collect [--programs lstm,conv_nchw] [--plans]
    python experiments/lab/dev_fidelity.py check [--programs lstm] [--no-scratch]
    python experiments/lab/dev_fidelity.py live [--programs random_dev_1000]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from unittest import mock

# run from experiments/lab/: common, dev_programs and schedule_fidelity are in experiments/, one up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import RESULTS, command, read_csv, stamp, write_csv  # noqa: E402
from dev_programs import DEV_PROGRAMS  # noqa: E402
from schedule_fidelity import baseline_schedules  # noqa: E402

import remat_opt  # noqa: E402
from remat_opt._schedule import Schedule  # noqa: E402
from remat_opt.baselines import BaselineCall, Reference, reference  # noqa: E402
from remat_opt.memory import _facts  # noqa: E402
from remat_opt.memory import simulate  # noqa: E402
from remat_opt.rewrite import apply_schedule  # noqa: E402

CSV = RESULTS / "dev_fidelity.csv"
LABELS = ("chen", "chen2", "chen3", "chen4", "greedy0", "greedy3", "greedy6", "revolve0", "revolve1")


def program_reference(name: str) -> Reference:
    """The development program's plain peak and calibrated graph, its facts read off XLA."""
    program = DEV_PROGRAMS[name]()
    return reference(BaselineCall(program.loss, program.args, budget_bytes=1 << 40, argnums=program.argnums))


PLAN_FRACTIONS = (0.8, 0.6)
"""Budgets, as shares of the plain peak, whose plans ``collect --plans`` measures too."""


def planned_schedules(name: str, plain_peak: int) -> dict[str, Schedule]:
    """The schedules ``optimize`` returns at :data:`PLAN_FRACTIONS` of the plain peak
    (with the held-out run's solver options), labelled ``plan0.8`` and so on."""
    program = DEV_PROGRAMS[name]()
    options = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=2, seed=0)
    out = {}
    for fraction in PLAN_FRACTIONS:
        try:
            plan = remat_opt.optimize(program.loss, int(fraction * plain_peak), argnums=program.argnums,
                                      solver_options=options).plan(*program.args)
        except remat_opt.InfeasibleBudgetError:
            continue
        if plan.schedule is not None and not plan.schedule.plain and plan.loop_plan is None:
            out[f"plan{fraction}"] = plan.schedule
    return out


def collect(names: list[str], plans: bool = False) -> list[dict]:
    rows = []
    for name in names:
        ref = program_reference(name)
        seen: set[Schedule] = set()
        labelled = {k: s for k, s in baseline_schedules(ref.graph).items() if k in LABELS}
        if plans:
            labelled |= planned_schedules(name, ref.plain_peak_bytes)
        for label, schedule in labelled.items():
            if schedule.plain or schedule in seen:
                continue
            seen.add(schedule)
            measured = ref.peak(apply_schedule(ref.fn, ref.graph, schedule))
            rows.append({"program": name, "label": label, "measured_peak_bytes": measured,
                         "plain_peak_bytes": ref.plain_peak_bytes, "schedule": schedule.to_json()})
            print(f"  {name} {label}: measured {measured}", flush=True)
    return rows


def check(rows: list[dict], scratch: bool = True) -> list[dict]:
    """``rows`` with the current model's prediction and its relative error
    (without the transposes' scratch read off XLA, unless ``scratch``)."""
    refs: dict[str, Reference] = {}
    out = []
    for r in rows:
        if r["program"] not in refs:
            with contextlib.ExitStack() as stack:
                if not scratch:  # read nothing, before the plain program calibrates the model
                    stack.enter_context(mock.patch.object(_facts, "scratch_per_unit", lambda graph, read: ()))
                refs[r["program"]] = program_reference(r["program"])
        predicted = simulate(refs[r["program"]].graph, Schedule.from_json(r["schedule"])).peak_bytes
        measured = int(r["measured_peak_bytes"])
        out.append({**r, "predicted_peak_bytes": predicted, "relative_error": predicted / measured - 1})
    return out


def live(rows: list[dict]) -> list[dict]:
    """``rows`` re-predicted (:func:`check`), with XLA's allocated bytes and its bytes
    live at the peak instruction for each schedule, compiled again."""
    out = []
    refs: dict[str, Reference] = {}
    for r in check(rows):
        ref = refs.setdefault(r["program"], program_reference(r["program"]))
        program = apply_schedule(ref.fn, ref.graph, Schedule.from_json(r["schedule"]))
        found = remat_opt.fragmentation(program, *ref.args, argnums=ref.nums, **ref.kwargs)
        out.append({"program": r["program"], "label": r["label"], "predicted_peak_bytes": r["predicted_peak_bytes"],
                    "allocated_bytes": found.allocated_bytes, "live_at_peak_bytes": found.live_bytes,
                    "error_vs_allocated": r["predicted_peak_bytes"] / found.allocated_bytes - 1,
                    "error_vs_live": r["predicted_peak_bytes"] / found.live_bytes - 1})
        print(f"  {r['program']:18s} {r['label']:9s} {out[-1]['error_vs_allocated']:+.1%} of allocated, "
              f"{out[-1]['error_vs_live']:+.1%} of live", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("check", "collect", "live"))
    parser.add_argument("--programs", default=",".join(DEV_PROGRAMS))
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--plans", action="store_true",
                        help=f"collect: also the plans optimize returns at {PLAN_FRACTIONS} of the plain peak")
    parser.add_argument("--no-scratch", action="store_true", help="check: without the transposes' scratch")
    args = parser.parse_args(argv)
    names = [n for n in args.programs.split(",") if n]
    if args.mode == "collect":
        rows = collect(names, args.plans)
        # Rows of the programs not collected now are kept, measured as they were.
        kept = [r for r in read_csv(args.csv) if r["program"] not in names] if args.csv.exists() else []
        write_csv(args.csv, kept + rows, f"{stamp()}\nreproduce: {command()} (rows of other programs kept "
                  "from the file's earlier runs)" if kept else f"{stamp()}\nreproduce: {command()}")
        print(f"wrote {len(rows)} schedules to {args.csv}, {len(kept)} kept")
        return 0
    if args.mode == "live":
        rows = live([r for r in read_csv(args.csv) if r["program"] in names])
        write_csv(RESULTS / "dev_fidelity_live.csv", rows, f"{stamp()}\nreproduce: {command()}")
        return 0
    checked = check([r for r in read_csv(args.csv) if r["program"] in names], not args.no_scratch)
    for r in checked:
        print(f"  {r['program']:18s} {r['label']:9s} predicted {r['predicted_peak_bytes'] / 2**20:7.2f} MiB "
              f"measured {int(r['measured_peak_bytes']) / 2**20:7.2f} MiB {r['relative_error']:+.1%}")
    for name in [*names, None]:
        errors = [r["relative_error"] for r in checked if name is None or r["program"] == name]
        if errors:
            print(f"{name or 'all':18s} {sum(abs(e) <= 0.05 for e in errors)}/{len(errors)} within 5%, "
                  f"{sum(abs(e) <= 0.10 for e in errors)}/{len(errors)} within 10%, "
                  f"{min(errors):+.1%} .. {max(errors):+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
