"""Fidelity: the memory model's predicted peak against XLA's measured peak.

Reads every plan that has both figures from ``results/pareto.csv`` (written by
``pareto.py``: remat_opt's plans at every budget, and the baselines expressed
as schedules on the program graph, Chen's), plots predicted against measured
and prints the relative error of each and the largest, ``(predicted −
measured) / measured``. A positive error is a conservative model (budget left
unused); a negative one is a plan XLA measured over its prediction, which
``optimize`` catches by re-solving under a tightened target.

Usage:
    python experiments/pareto.py            # first, to measure the plans
    python experiments/fidelity.py [--csv experiments/results/pareto.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, read_csv, stamp, write_csv  # noqa: E402


def relative_errors(rows: list[dict]) -> list[dict]:
    """Rows with both a predicted and a measured peak, with their relative error."""
    out = []
    for r in rows:
        if not r.get("predicted_peak_bytes") or not r.get("measured_peak_bytes"):
            continue
        predicted, measured = int(r["predicted_peak_bytes"]), int(r["measured_peak_bytes"])
        out.append({
            "model": r["model"], "strategy": r["strategy"], "budget_bytes": r["budget_bytes"],
            "status": r["status"], "predicted_peak_bytes": predicted, "measured_peak_bytes": measured,
            "relative_error": (predicted - measured) / measured,
        })
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
    args = parser.parse_args(argv)
    if not args.csv.exists():
        parser.error(f"{args.csv} does not exist; run experiments/pareto.py first.")
    out = args.out or args.csv.parent
    points = relative_errors(read_csv(args.csv))
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
