"""Development-set fidelity: the memory model on ``dev_programs.py``, measured once, re-predicted fast.

The development set is where a change to the model for a family the zoo
lacks (recurrent cells, conv nets in other layouts) is diagnosed and checked,
so that the held-out set (``heldout.py``) stays an evaluation set.
``collect`` measures, for each development program, the schedules
``schedule_fidelity.baseline_schedules`` picks (Chen's segmentations, a few
of Chen's greedy candidates, Revolve's trees the model ranks lowest) and
writes each schedule with XLA's peak to ``results/dev_fidelity.csv``.
``check`` re-predicts every row with the model as it is now, in seconds.

Usage:
    python experiments/dev_fidelity.py collect [--programs lstm,conv_nchw]
    python experiments/dev_fidelity.py check [--programs lstm] [--no-scratch]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, read_csv, stamp, write_csv  # noqa: E402
from dev_programs import DEV_PROGRAMS  # noqa: E402
from schedule_fidelity import baseline_schedules  # noqa: E402

from remat_opt._schedule import Schedule  # noqa: E402
from remat_opt.baselines._reference import Reference, reference  # noqa: E402
from remat_opt.memory import _facts  # noqa: E402
from remat_opt.memory._simulate import simulate  # noqa: E402
from remat_opt.rewrite._apply import apply_schedule  # noqa: E402

CSV = RESULTS / "dev_fidelity.csv"
LABELS = ("chen", "chen2", "chen3", "chen4", "greedy0", "greedy3", "greedy6", "revolve0", "revolve1")


def program_reference(name: str) -> Reference:
    """The development program's plain peak and calibrated graph, its facts read off XLA."""
    program = DEV_PROGRAMS[name]()
    return reference(program.loss, program.args, {}, program.argnums, 1 << 40, None)


def collect(names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        ref = program_reference(name)
        seen: set[Schedule] = set()
        for label, schedule in baseline_schedules(ref.graph).items():
            if label not in LABELS or schedule.plain or schedule in seen:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("check", "collect"))
    parser.add_argument("--programs", default=",".join(DEV_PROGRAMS))
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--no-scratch", action="store_true", help="check: without the transposes' scratch")
    args = parser.parse_args(argv)
    names = [n for n in args.programs.split(",") if n]
    if args.mode == "collect":
        rows = collect(names)
        # Rows of the programs not collected now are kept, measured as they were.
        kept = [r for r in read_csv(args.csv) if r["program"] not in names] if args.csv.exists() else []
        write_csv(args.csv, kept + rows, f"{stamp()}\nreproduce: {command()} (rows of other programs kept "
                  "from the file's earlier runs)" if kept else f"{stamp()}\nreproduce: {command()}")
        print(f"wrote {len(rows)} schedules to {args.csv}, {len(kept)} kept")
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
