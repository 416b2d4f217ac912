"""An evaluation set's figures after programs move out of it (issue 50), beside the figures before.

When a program drives a change it leaves the held-out (or fresh) set for the development set and a
new one takes its place (``heldout_programs.py``). Re-running the whole set takes about 45 minutes
on two cores; this prints :func:`heldout.summary` for the last full run (``--base``), and for the
set as it is now: the base run's rows without the moved programs (``--moved``), with the rows of a
run of the new programs alone (``--added``, ``heldout.py --programs ...``). The kept rows and the
added rows may come from different versions of remat_opt: each file's stamp says which.

Usage:
    python experiments/heldout_recompose.py --base results/heldout_session38/heldout.csv \
        --moved gru,haiku_resnet --added results/heldout_issue50/heldout.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import read_csv  # noqa: E402
from heldout import summary  # noqa: E402


def typed(row: dict) -> dict:
    """A row read back from CSV, with the fields :func:`summary` computes on as numbers and booleans."""
    out = dict(row)
    for key in ("error", "budget_bytes", "min_budget_bytes", "min_budget_over_params_and_grads"):
        out[key] = float(row[key]) if row.get(key) not in (None, "") else None
    out["fits"] = {"True": True, "False": False}.get(row.get("fits"))
    out["exception"] = row.get("exception") or None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the last full run's CSV")
    parser.add_argument("--moved", type=lambda s: set(s.split(",")), required=True, help="programs moved out")
    parser.add_argument("--added", type=Path, required=True, help="a run of the replacements alone")
    args = parser.parse_args(argv)
    base = [typed(r) for r in read_csv(args.base)]
    added = [typed(r) for r in read_csv(args.added)]
    kept = [r for r in base if r["program"] not in args.moved]
    now = kept + added
    for title, rows in ((f"before: {args.base}", base), (f"moved out: {', '.join(sorted(args.moved))}",
                                                          [r for r in base if r["program"] in args.moved]),
                        (f"added: {', '.join(sorted({r['program'] for r in added}))} ({args.added})", added),
                        ("now: kept + added", now)):
        print(f"\n== {title}: {len({r['program'] for r in rows})} programs\n{summary(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
