"""Fidelity: the memory model's predicted peak against XLA's measured peak.

Reads every plan that has both figures from ``results/pareto.csv`` (written by
``pareto.py``: remat_opt's plans at every budget, and the baselines expressed
as schedules on the program graph, Chen's), plots predicted against measured
and prints the relative error of each and the largest, ``(predicted −
measured) / measured``. A positive error is a conservative model (budget left
unused); a negative one is a plan XLA measured over its prediction, which
``optimize`` catches by re-solving under a tightened target.

With ``--repredict``, every plan stored with its schedule is predicted again
by the memory model as it is now (XLA's measurement is kept; the sweep's own
prediction stays in ``sweep_predicted_peak_bytes``): a model change is judged
on the sweep's plans in seconds, without the hour the sweep takes. The plans
are still the ones the sweep's code chose.

Usage:
    python experiments/pareto.py            # first, to measure the plans
    python experiments/fidelity.py [--csv experiments/results/pareto.csv] [--repredict]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, read_csv, stamp, write_csv  # noqa: E402
from schedule_fidelity import model_reference  # noqa: E402

from remat_opt.memory import simulate  # noqa: E402
from remat_opt._schedule import Schedule  # noqa: E402
from remat_opt.zoo import MODELS  # noqa: E402


def repredict(rows: list[dict]) -> list[dict]:
    """``rows`` with each stored schedule predicted by today's model; the
    sweep's prediction moves to ``sweep_predicted_peak_bytes``."""
    graphs = {}
    out = []
    for r in rows:
        if r.get("schedule"):
            key = (r["model"], r["config"])
            if key not in graphs:
                config = type(MODELS[r["model"]].default_config)(**json.loads(r["config"]))
                graphs[key] = model_reference(r["model"], config)[0].graph
            predicted = simulate(graphs[key], Schedule.from_json(r["schedule"])).peak_bytes
            r = {**r, "sweep_predicted_peak_bytes": r["predicted_peak_bytes"], "predicted_peak_bytes": predicted}
        out.append(r)
    return out


def relative_errors(rows: list[dict]) -> list[dict]:
    """Rows with both a predicted and a measured peak, with their relative error."""
    out = []
    for r in rows:
        if not r.get("predicted_peak_bytes") or not r.get("measured_peak_bytes"):
            continue
        predicted, measured = int(r["predicted_peak_bytes"]), int(r["measured_peak_bytes"])
        point = {
            "model": r["model"], "strategy": r["strategy"], "budget_bytes": r["budget_bytes"],
            "status": r["status"], "predicted_peak_bytes": predicted, "measured_peak_bytes": measured,
            "relative_error": (predicted - measured) / measured,
        }
        if r.get("sweep_predicted_peak_bytes"):
            point["sweep_predicted_peak_bytes"] = int(r["sweep_predicted_peak_bytes"])
        out.append(point)
    return out


def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for model in sorted({p["model"] for p in points}):
        mine = [p for p in points if p["model"] == model]
        ax.scatter([p["measured_peak_bytes"] / MiB for p in mine], [p["predicted_peak_bytes"] / MiB for p in mine],
                   label=model, s=18)
    top = max(max(p["measured_peak_bytes"], p["predicted_peak_bytes"]) for p in points) / MiB * 1.05
    ax.plot([0, top], [0, top], color="black", lw=0.8)
    ax.fill_between([0, top], [0, 0.95 * top], [0, 1.05 * top], color="gray", alpha=0.15, label="±5%")
    ax.set_xlabel("XLA measured peak (MiB)")
    ax.set_ylabel("predicted peak (MiB)")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=RESULTS / "pareto.csv")
    parser.add_argument("--out", type=Path, default=None, help="folder for fidelity.csv/png (default: the CSV's)")
    parser.add_argument("--repredict", action="store_true",
                        help="predict the stored schedules again with today's model (seconds a model)")
    args = parser.parse_args(argv)
    if not args.csv.exists():
        parser.error(f"{args.csv} does not exist; run experiments/pareto.py first.")
    out = args.out or args.csv.parent
    rows = read_csv(args.csv)
    if args.repredict:
        if not any(r.get("schedule") for r in rows):
            parser.error(f"{args.csv} stores no schedules (written before pareto.py stored them); run pareto.py again.")
        rows = repredict(rows)
    points = relative_errors(rows)
    if not points:
        parser.error(f"{args.csv} has no plan with both a predicted and a measured peak.")
    header = f"{stamp()}\nreproduce: {command()}"
    print(header)
    print("\n| model | strategy | budget MiB | predicted MiB | measured MiB | error |")
    print("|---|---|---:|---:|---:|---:|")
    for p in points:
        print(f"| {p['model']} | {p['strategy']} | {int(p['budget_bytes']) / MiB:.2f} | "
              f"{p['predicted_peak_bytes'] / MiB:.2f} | {p['measured_peak_bytes'] / MiB:.2f} | "
              f"{p['relative_error']:+.1%} |")
    worst = max(points, key=lambda p: abs(p["relative_error"]))
    print(f"\nmax |relative error| over {len(points)} plans: {abs(worst['relative_error']):.1%} "
          f"({worst['model']}, {worst['strategy']}, budget {int(worst['budget_bytes']) / MiB:.2f} MiB)")
    write_csv(out / "fidelity.csv", points, header)
    plot(points, out / "fidelity.png", header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
