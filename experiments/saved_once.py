"""Stored values computed once: XLA's peak with and without, on the plans that save names.

``optimize(..., compute_saved_once=True)`` (the default) gives each stored value XLA would
rebuild in every reader from its operands a reader XLA cannot fuse
(:mod:`remat_opt.memory._once`). This measures what that does to XLA's peak on every
plan of ``results/schedule_fidelity.csv`` that saves names (remat_opt's CP-SAT
plans of the zoo models; the others get no such readers), beside the memory
model's prediction. Writes ``saved_once.csv`` under
``--out``.

Usage:
    python experiments/saved_once.py [--models gpt,unet] [--out DIR]   # about 10 minutes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, read_csv, stamp, write_csv  # noqa: E402
from schedule_fidelity import CSV, model_reference  # noqa: E402

from remat_opt.memory import simulate  # noqa: E402
from remat_opt.memory._once import once_values  # noqa: E402
from remat_opt.rewrite import apply_schedule  # noqa: E402
from remat_opt._schedule import Schedule  # noqa: E402


def measure(models: list[str]) -> list[dict]:
    rows = []
    refs = {}
    for r in read_csv(CSV):
        schedule = Schedule.from_json(r["schedule"])
        if r["model"] not in models or not schedule.saved:
            continue
        if r["model"] not in refs:
            refs[r["model"]] = model_reference(r["model"])[0]
        ref = refs[r["model"]]
        without = ref.peak(apply_schedule(ref.fn, ref.graph, schedule, compute_saved_once=False))
        once = ref.peak(apply_schedule(ref.fn, ref.graph, schedule, compute_saved_once=True))
        predicted = simulate(ref.graph, schedule).peak_bytes
        rows.append({"model": r["model"], "label": r["label"], "saved_names": len(schedule.saved),
                     "values_once": len(once_values(ref.graph, schedule)),
                     "peak_bytes": without, "peak_once_bytes": once, "change": (once - without) / without,
                     "predicted_peak_bytes": predicted,
                     "error": (predicted - without) / without, "error_once": (predicted - once) / once})
        row = rows[-1]
        print(f"  {row['model']:6s} {row['label']:22s} {without / 2**20:7.2f} -> {once / 2**20:7.2f} MiB "
              f"({row['change']:+.1%}); predicted {row['error']:+.1%} -> {row['error_once']:+.1%}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,resnet,unet")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = measure(args.models.split(","))
    if not rows:
        print("no plan that saves names in", CSV)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "saved_once.csv"
    write_csv(path, rows, f"{stamp()}\nreproduce: {command()}")
    for model in sorted({r["model"] for r in rows}):
        changes = [r["change"] for r in rows if r["model"] == model]
        print(f"{model}: {len(changes)} plans, peak {min(changes):+.1%} .. {max(changes):+.1%}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
