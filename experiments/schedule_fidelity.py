"""Schedule fidelity: the memory model against XLA on a fixed set of measured schedules.

``pareto.py`` and ``fidelity.py`` measure the plans of one sweep, and those
change whenever the model does (CP-SAT plans with it). Changing the model
needs a yardstick that stays put: many schedules of the zoo models, each
measured on XLA once, re-predicted in seconds by every model revision.

``collect`` measures Chen's segmentations (the default count and 2, 3, 4, 6,
8 segments), every few of Chen's greedy candidates, Revolve's four trees the
model ranks lowest and, with ``--plans``, remat_opt's plans at the budgets of
``results/pareto.csv``; it writes each schedule (JSON) with XLA's peak to
``results/schedule_fidelity.csv``. ``check`` re-predicts every row with the
current model and prints the errors, ``(predicted - measured) / measured``.

Usage:
    python experiments/schedule_fidelity.py check          # seconds per model
    python experiments/schedule_fidelity.py collect [--models gpt,unet] [--plans]
    python experiments/schedule_fidelity.py remeasure      # the rows that save names, by today's rewriter
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, read_csv, stamp, write_csv  # noqa: E402

import remat_opt  # noqa: E402
from remat_opt.solve import chen_greedy_candidates, chen_sqrt_n_schedule  # noqa: E402
from remat_opt.program import ProgramGraph  # noqa: E402
from remat_opt.memory import simulate  # noqa: E402
from remat_opt.solve import revolve_schedules  # noqa: E402
from remat_opt.rewrite import apply_schedule  # noqa: E402
from remat_opt.baselines import BaselineCall, Reference, reference  # noqa: E402
from remat_opt._schedule import Schedule  # noqa: E402
from remat_opt.zoo import MODELS  # noqa: E402

CSV = RESULTS / "schedule_fidelity.csv"


def model_reference(name: str, config=None, xla_facts: bool = True) -> tuple[Reference, tuple]:
    """The zoo model (its default config unless given), its plain peak and its
    calibrated graph (its facts read off XLA's compiled program unless ``xla_facts`` is off)."""
    spec = MODELS[name]
    params, batch = spec.init(config or spec.default_config, jax.random.PRNGKey(0))
    return reference(BaselineCall(spec.loss, (params, batch), budget_bytes=1 << 40), xla_facts), (params, batch)


def baseline_schedules(graph: ProgramGraph) -> dict[str, Schedule]:
    out: dict[str, Schedule] = {}
    for n in (None, 2, 3, 4, 6, 8):
        out[f"chen{n or ''}"] = chen_sqrt_n_schedule(graph, n)
    candidates = chen_greedy_candidates(graph)
    for i, (_, s) in enumerate(candidates[:: max(1, len(candidates) // 8)]):
        out[f"greedy{i}"] = s
    for i, s in enumerate(sorted(revolve_schedules(graph), key=lambda s: simulate(graph, s).peak_bytes)[:4]):
        out[f"revolve{i}"] = s
    return out


def collect(names: list[str], plans: bool) -> list[dict]:
    rows = []
    options = remat_opt.SolverOptions(time_limit_s=120.0, deterministic_time_limit=10.0, num_workers=8)
    for name in names:
        ref, args = model_reference(name)
        labelled = {label: s for label, s in baseline_schedules(ref.graph).items() if not s.plain}
        if plans:
            budgets = sorted({int(r["budget_bytes"]) for r in read_csv(RESULTS / "pareto.csv")
                              if r["model"] == name and r["strategy"] == "remat_opt"})
            for budget in budgets:
                try:
                    plan = remat_opt.optimize(ref.fn, budget, solver_options=options).plan(*args)
                except remat_opt.RematOptError:
                    continue
                if plan.schedule is not None and not plan.schedule.plain:
                    labelled[f"remat_opt{budget}"] = plan.schedule
        seen: set[Schedule] = set()
        for label, schedule in labelled.items():
            if schedule in seen:
                continue
            seen.add(schedule)
            measured = ref.peak(apply_schedule(ref.fn, ref.graph, schedule))
            rows.append({"model": name, "label": label, "measured_peak_bytes": measured,
                         "schedule": schedule.to_json()})
            print(f"  {name} {label}: measured {measured}", flush=True)
    return rows


def remeasure(rows: list[dict], models: list[str]) -> list[dict]:
    """``rows`` with the schedules that save names measured again, by the
    rewriter as it is now (its default, stored values computed once,
    changes only those programs: :mod:`remat_opt.memory._once`)."""
    refs: dict[str, Reference] = {}
    out = []
    for r in rows:
        schedule = Schedule.from_json(r["schedule"])
        if r["model"] in models and schedule.saved:
            if r["model"] not in refs:
                refs[r["model"]] = model_reference(r["model"])[0]
            ref = refs[r["model"]]
            measured = ref.peak(apply_schedule(ref.fn, ref.graph, schedule))
            print(f"  {r['model']} {r['label']}: {int(r['measured_peak_bytes'])} -> {measured}", flush=True)
            r = {**r, "measured_peak_bytes": measured}
        out.append(r)
    return out


def check(rows: list[dict], xla_facts: bool = True) -> list[dict]:
    """``rows`` with the current model's prediction and its relative error."""
    graphs: dict[str, ProgramGraph] = {}
    out = []
    for r in rows:
        if r["model"] not in graphs:
            graphs[r["model"]] = model_reference(r["model"], xla_facts=xla_facts)[0].graph
        predicted = simulate(graphs[r["model"]], Schedule.from_json(r["schedule"])).peak_bytes
        measured = int(r["measured_peak_bytes"])
        out.append({**r, "predicted_peak_bytes": predicted, "relative_error": (predicted - measured) / measured})
    return out


def summary(checked: list[dict], tolerance: float = 0.05) -> str:
    lines = []
    for model in sorted({r["model"] for r in checked}) + [None]:
        errors = [r["relative_error"] for r in checked if model is None or r["model"] == model]
        inside = sum(abs(e) <= tolerance for e in errors)
        lines.append(f"{model or 'all':7s} {inside}/{len(errors)} within {tolerance:.0%}, "
                     f"{min(errors):+.1%} .. {max(errors):+.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("check", "collect", "remeasure"))
    parser.add_argument("--models", default="gpt,mlp,resnet,unet")
    parser.add_argument("--plans", action="store_true", help="collect: also remat_opt's plans (minutes each)")
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--rules", action="store_true",
                        help="check: the hand-written fusion rules instead of facts read off XLA's compiled program")
    args = parser.parse_args(argv)
    if args.mode == "collect":
        rows = collect(args.models.split(","), args.plans)
        write_csv(args.csv, rows, f"{stamp()}\nreproduce: {command()}")
        print(f"wrote {len(rows)} schedules to {args.csv}")
        return 0
    if args.mode == "remeasure":
        rows = remeasure(read_csv(args.csv), args.models.split(","))
        header = [line[2:].rstrip("\n") for line in args.csv.open() if line.startswith("# ")]
        write_csv(args.csv, rows, "\n".join(header + [f"then the schedules that save names: {command()} ({stamp()})"]))
        print(f"wrote {len(rows)} schedules to {args.csv}")
        return 0
    checked = check([r for r in read_csv(args.csv) if r["model"] in args.models.split(",")], not args.rules)
    for r in checked:
        if abs(r["relative_error"]) > 0.05:
            print(f"  {r['model']:7s} {r['label']:20s} predicted {r['predicted_peak_bytes']:>11d} "
                  f"measured {int(r['measured_peak_bytes']):>11d} {r['relative_error']:+.1%}")
    print(summary(checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
