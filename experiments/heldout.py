"""Held-out fidelity: the memory model on programs it was not tuned on.

For each program of ``heldout_programs.PROGRAMS`` (fixed before any of them
was planned; see that module for how they were chosen and the rule that no
model rule or parameter may be tuned on them), through remat_opt's public API
only:

* ``plain``: the program as written (:func:`remat_opt.no_remat`): XLA's peak,
  and the model's prediction of it;
* ``schedule``: Chen's sqrt(n) and greedy segmentations and Revolve's
  lowest-memory binomial schedule (:func:`remat_opt.chen_sqrt_n`,
  :func:`remat_opt.chen_greedy`, :func:`remat_opt.revolve`): predicted
  against measured;
* ``policy``: ``jax.checkpoint`` around the whole loss with each built-in
  policy (:func:`remat_opt.checkpoint_policy`): measured only (the model does
  not describe them), for the best baseline below;
* ``plan``: :func:`remat_opt.optimize` at 0.8, 0.6 and 0.4 of the plain peak:
  predicted and measured peak, recomputed FLOPs as a fraction of the plain
  gradient's, the solver's status and gap, the wall time; or, where no plan
  fits, the ``min_budget_bytes`` of the :class:`remat_opt.InfeasibleBudgetError`.
  Beside each, the best baseline that fits that budget on XLA: the fewest
  recomputed FLOPs among the policies and schedules whose measured peak is
  at most the budget.

``error`` is ``predicted / measured - 1``. One row per program and strategy
(or budget) goes to ``<out>/heldout.csv`` (``heldout_quick.csv`` with
``--quick``), rewritten after every program, stamped with the jax version and
the machine; ``--label`` is stored in every row, so that the rows of two model
versions can be put side by side. A program or strategy that raises is a row
too (``exception``), its traceback printed, and the run goes on.

The solver gets a modest deterministic limit on two workers (``SOLVER``),
so that the full run takes under about 45 minutes on two cores. Every
strategy measures the plain program again (the public functions share
nothing), so XLA's executables are cached on disk for the run (a temporary
folder, removed at the end, unless ``JAX_COMPILATION_CACHE_DIR`` names one): a
cached executable is the one compiled, and its ``memory_analysis`` reads the
same.

Usage:
    python experiments/heldout.py [--set heldout|fresh|probe] [--programs random0,convnet]
                                  [--quick | --schedules-only] [--no-scratch] [--out DIR] [--label TEXT]

``--set fresh`` runs the same measurements on ``fresh_programs.PROGRAMS``
(written to ``<out>/fresh.csv``), a second evaluation set; ``--set probe`` on
``probe_programs.PROGRAMS`` (``<out>/probe.csv``), the programs written to
look for planner bugs.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax

import remat_opt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, stamp, write_csv  # noqa: E402
from heldout_programs import PROGRAMS, Program  # noqa: E402
import fresh_programs  # noqa: E402
import probe_programs  # noqa: E402

SETS = {"heldout": PROGRAMS, "fresh": fresh_programs.PROGRAMS, "probe": probe_programs.PROGRAMS}

FRACTIONS = (0.8, 0.6, 0.4)
QUICK_FRACTIONS = (0.6,)
QUICK_PROGRAMS = ("random2", "mixer", "equinox_transformer")
SOLVER = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=2, seed=0)
NO_BUDGET = 1 << 40  # baselines are not solved against a budget; each plan row compares them with its own
COLUMNS = ("label", "program", "kind", "strategy", "budget_fraction", "budget_bytes", "predicted_peak_bytes",
           "measured_peak_bytes", "error", "recompute_fraction", "fits", "seconds", "status", "gap", "solve_seconds",
           "attempts", "min_budget_bytes", "min_budget_over_params_and_grads", "best_baseline",
           "best_baseline_peak_bytes", "best_baseline_recompute_fraction", "plain_peak_bytes", "param_bytes",
           "baseline_flops", "num_segments", "nesting_depth", "loop_plan", "exception")
SCHEDULES = {"chen_sqrt_n": remat_opt.chen_sqrt_n, "chen_greedy": remat_opt.chen_greedy, "revolve": remat_opt.revolve}


def source() -> str:
    """Where remat_opt was imported from, and the git state of that tree (uncommitted changes counted)."""
    src = Path(remat_opt.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=src, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return f"remat_opt {remat_opt.__version__} from {src} (not a git tree)"
    return f"remat_opt {remat_opt.__version__} from {src}, git HEAD {head}, {len(dirty)} uncommitted path(s) in it"


def param_bytes(program: Program) -> int:
    """Bytes of the differentiated floating arrays (the gradient has as many)."""
    nums = (program.argnums,) if isinstance(program.argnums, int) else program.argnums
    return sum(leaf.size * leaf.dtype.itemsize for i in nums for leaf in jax.tree.leaves(program.args[i])
               if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating))


def relative_error(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return predicted / measured - 1


def plan_fields(plan: remat_opt.Plan) -> dict:
    """The columns every measured plan fills."""
    return {
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "measured_peak_bytes": plan.measured_peak_bytes,
        "error": relative_error(plan.predicted_peak_bytes, plan.measured_peak_bytes),
        "recompute_fraction": (plan.measured_recompute_flops / plan.baseline_flops
                               if plan.measured_recompute_flops is not None and plan.baseline_flops else None),
        "status": plan.status,
        "gap": plan.gap,
        "solve_seconds": round(plan.solve_seconds, 2),
        "attempts": plan.attempts,
        "num_segments": plan.num_segments,
        "nesting_depth": plan.schedule.depth() if plan.schedule is not None else None,
        "loop_plan": None if plan.loop_plan is None else str(plan.loop_plan),
        "baseline_flops": plan.baseline_flops,
    }


def failed(row: dict, err: BaseException) -> dict:
    print(f"  {row['strategy']}: {type(err).__name__}", flush=True)
    traceback.print_exception(err, file=sys.stdout)
    return {**row, "status": "EXCEPTION", "exception": f"{type(err).__name__}: {err}"[:500]}


def best_baseline(rows: list[dict], budget: int) -> dict | None:
    """The policy or schedule row with the fewest recomputed FLOPs whose measured peak fits ``budget``."""
    fitting = [r for r in rows if r["kind"] in ("schedule", "policy") and r.get("measured_peak_bytes") is not None
               and r.get("recompute_fraction") is not None and r["measured_peak_bytes"] <= budget]
    return min(fitting, key=lambda r: (r["recompute_fraction"], r["measured_peak_bytes"]), default=None)


def describe(row: dict) -> str:
    if row.get("exception"):
        return f"EXCEPTION {row['exception'][:120]}"
    if row.get("min_budget_bytes") is not None:
        return f"refused: min budget {row['min_budget_bytes'] / MiB:.2f} MiB"
    predicted = "-" if row.get("predicted_peak_bytes") is None else f"{row['predicted_peak_bytes'] / MiB:.2f}"
    error = "" if row.get("error") is None else f" ({row['error']:+.1%})"
    fits = "" if row.get("fits") is None else (", fits" if row["fits"] else ", DOES NOT FIT")
    return (f"predicted {predicted} measured {row['measured_peak_bytes'] / MiB:.2f} MiB{error}, "
            f"+{row['recompute_fraction']:.1%} FLOPs{fits}, {row['seconds']:.0f} s")


def run_program(name: str, fractions: tuple[float, ...], options: remat_opt.SolverOptions, label: str,
                programs: dict[str, Callable[[], Program]] = PROGRAMS) -> list[dict]:
    start = time.perf_counter()
    base = {"label": label, "program": name}
    try:
        program = programs[name]()
    except Exception as err:  # noqa: BLE001 - a missing library, say: a row says so, the run goes on
        return [failed({**base, "kind": "plain", "strategy": "build"}, err)]
    print(f"{name}: {program.description}; built in {time.perf_counter() - start:.1f} s", flush=True)
    rows = measure_baselines(program, base, remat_opt.POLICIES if fractions else ())
    plain = rows[0].get("plain_peak_bytes")
    for fraction in fractions if plain is not None else ():
        rows.append(measure_plan(program, fraction, rows, options)[0])
    print(f"  {name} done in {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def measure_baselines(program: Program, base: dict, policies: Iterable[str] = (),
                      schedules: Iterable[str] = tuple(SCHEDULES)) -> list[dict]:
    """Rows of the plain step, then of ``schedules`` and of ``jax.checkpoint``
    around the loss with each of ``policies``: predicted and measured peaks.
    Only the plain row if the plain step fails."""
    loss, args, nums = program.loss, program.args, program.argnums
    base = {**base, "param_bytes": param_bytes(program)}

    def baseline(kind: str, strategy: str, make) -> dict:
        row = {**base, "kind": kind, "strategy": strategy}
        t = time.perf_counter()
        try:
            plan = make()
        except Exception as err:  # noqa: BLE001 - recorded with its traceback; the run goes on
            return failed(row, err)
        row.update(plan_fields(plan), plain_peak_bytes=plan.plain_peak_bytes,
                   seconds=round(time.perf_counter() - t, 1))
        print(f"  {kind:8s} {strategy:44s} {describe(row)}", flush=True)
        return row

    call = remat_opt.BaselineCall(loss, tuple(args), budget_bytes=NO_BUDGET, argnums=nums)
    rows = [baseline("plain", "no_remat", lambda: remat_opt.no_remat(call))]
    plain = rows[0].get("plain_peak_bytes")
    if plain is None:
        return rows
    print(f"  plain peak {plain / MiB:.2f} MiB, parameters {base['param_bytes'] / MiB:.2f} MiB", flush=True)
    for strategy in schedules:
        fn = SCHEDULES[strategy]
        rows.append(baseline("schedule", strategy, lambda fn=fn: fn(call)))
    for policy in policies:  # for the plans' best baseline
        rows.append(baseline("policy", f"checkpoint/{policy}",
                             lambda policy=policy: remat_opt.checkpoint_policy(call, policy)))
    return rows


def measure_plan(program: Program, fraction: float, rows: list[dict], options: remat_opt.SolverOptions
                 ) -> tuple[dict, Callable[..., Any] | None]:
    """The row of :func:`remat_opt.optimize` at ``fraction`` of the plain peak
    (``rows[0]``, from :func:`measure_baselines`), beside the best of ``rows``
    that fits; and the optimized loss (``None`` where no plan was returned)."""
    plain = rows[0]["plain_peak_bytes"]
    budget = int(fraction * plain)
    row = {**{k: rows[0][k] for k in ("label", "program", "param_bytes")}, "kind": "plan", "strategy": "remat_opt",
           "budget_fraction": fraction, "budget_bytes": budget, "plain_peak_bytes": plain}
    best = best_baseline(rows, budget)
    row.update(best_baseline=None if best is None else best["strategy"],
               best_baseline_peak_bytes=None if best is None else best["measured_peak_bytes"],
               best_baseline_recompute_fraction=None if best is None else best["recompute_fraction"])
    t = time.perf_counter()
    step = None
    try:
        step = remat_opt.optimize(program.loss, budget, argnums=program.argnums, solver_options=options)
        plan = step.plan(*program.args)
    except remat_opt.InfeasibleBudgetError as err:
        step = None
        params = row["param_bytes"]
        row.update(status="INFEASIBLE", min_budget_bytes=err.min_budget_bytes,
                   min_budget_over_params_and_grads=err.min_budget_bytes / (2 * params) if params else None)
    except Exception as err:  # noqa: BLE001 - recorded with its traceback; the run goes on
        step = None
        row = failed(row, err)
    else:
        row.update(plan_fields(plan), fits=plan.fits)
    row["seconds"] = round(time.perf_counter() - t, 1)
    print(f"  plan {fraction:.1f}  {budget / MiB:7.2f} MiB budget {'':18s} {describe(row)}", flush=True)
    return row, step


def summary(rows: list[dict]) -> str:
    """Per kind: rows predicted, within 5% and 10%, min/max error; refusals, misses, exceptions."""
    lines = [f"{'kind':9s} {'rows':>5s} {'within 5%':>10s} {'within 10%':>11s} {'min error':>10s} {'max error':>10s}"]
    for kind in ("plain", "schedule", "plan"):
        errors = [r["error"] for r in rows if r["kind"] == kind and r.get("error") is not None]
        if not errors:
            lines.append(f"{kind:9s} {0:5d}")
            continue
        within5, within10 = (sum(abs(e) <= tol for e in errors) for tol in (0.05, 0.10))
        lines.append(f"{kind:9s} {len(errors):5d} {within5:10d} {within10:11d} "
                     f"{min(errors):+10.1%} {max(errors):+10.1%}")
    plans = [r for r in rows if r["kind"] == "plan"]
    refused = [r for r in plans if r.get("status") == "INFEASIBLE"]
    lines.append(f"plans: {len(plans)}, refused {len(refused)}, "
                 f"over budget on XLA {sum(r.get('fits') is False for r in plans)}")
    for r in refused:
        ratio = r.get("min_budget_over_params_and_grads")
        lines.append(f"  refused {r['program']} at {r['budget_fraction']} ({r['budget_bytes'] / MiB:.2f} MiB): "
                     f"min budget {r['min_budget_bytes'] / MiB:.2f} MiB"
                     + ("" if ratio is None else f" = {ratio:.2f} x parameters + gradients"))
    for r in rows:
        if r.get("exception"):
            lines.append(f"  EXCEPTION {r['program']} {r['kind']} {r['strategy']}: {r['exception'][:200]}")
    over = [r for r in rows if r.get("error") is not None and abs(r["error"]) > 0.10]
    for r in sorted(over, key=lambda r: -abs(r["error"])):
        where = f" at {r['budget_fraction']}" if r["kind"] == "plan" else ""
        lines.append(f"  off by more than 10%: {r['program']} {r['kind']} {r['strategy']}{where}: {r['error']:+.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=SETS, default="heldout",
                        help="the held-out programs, or the fresh ones (experiments/fresh_programs.py)")
    parser.add_argument("--programs", type=lambda s: [p for p in s.split(",") if p],
                        help=f"comma-separated names, of: {', '.join(PROGRAMS)} (or of the fresh set)")
    parser.add_argument("--quick", action="store_true",
                        help=f"budgets {QUICK_FRACTIONS} only; programs {','.join(QUICK_PROGRAMS)} unless --programs")
    parser.add_argument("--schedules-only", action="store_true",
                        help="the plain program and the schedules only: the model's fidelity, no plans or policies")
    parser.add_argument("--no-scratch", action="store_true",
                        help="the model without the transposes' scratch read off XLA (the model before it)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="free text stored in every row (a model version, say)")
    args = parser.parse_args(argv)
    if args.no_scratch:  # read nothing, before the plain program calibrates the model
        from remat_opt.memory import _facts
        _facts.scratch_per_unit = lambda graph, read: ()
    programs = SETS[args.set]
    quick = QUICK_PROGRAMS if args.set == "heldout" else tuple(programs)[:3]
    names = args.programs or (list(quick) if args.quick else list(programs))
    unknown = [n for n in names if n not in programs]
    if unknown:
        parser.error(f"unknown programs {unknown}; known: {', '.join(programs)}")
    fractions = () if args.schedules_only else QUICK_FRACTIONS if args.quick else FRACTIONS
    header = f"{stamp()}\n{source()}\nreproduce: {command()}\nlabel: {args.label}; solver: {SOLVER}"
    print(header, flush=True)
    path = args.out / f"{args.set}{'_quick' if args.quick else ''}.csv"
    cache = None
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        cache = tempfile.mkdtemp(prefix="heldout_xla_")
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    start = time.perf_counter()
    rows: list[dict] = []
    for name in names:
        rows += run_program(name, fractions, SOLVER, args.label, programs)
        write_csv(path, [{c: r.get(c) for c in COLUMNS} for r in rows], header)
    wall = time.perf_counter() - start
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"\n{summary(rows)}\n\n{len(names)} programs, {len(rows)} rows, wall time {wall / 60:.1f} min; "
          f"wrote {path}", flush=True)
    assert all(math.isfinite(r["error"]) for r in rows if r.get("error") is not None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
