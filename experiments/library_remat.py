"""The held-out library models against their library's own per-block remat (issue 21, item 2).

For each library program of ``heldout_programs`` (dm-haiku VGG (the haiku ResNet before issue 50), Flax NNX
ViT, Equinox encoder, penzai decoder), as its users write it, at 0.8, 0.6 and
0.4 of its plain XLA peak:

* ``remat_opt``: :func:`remat_opt.optimize` at that budget (the held-out
  script's solver options), its XLA peak, its recomputed FLOPs, and its
  gradients against the plain step's; or its refusal and ``min_budget_bytes``;
* every baseline, measured once per program and compared with each budget:
  Chen's sqrt(n) and greedy segmentations and Revolve (fenced, through
  remat_opt's rewriter), ``jax.checkpoint`` around the whole loss with each
  built-in policy (:func:`remat_opt.checkpoint_policy`), and the library's own
  per-block remat with each built-in policy (the ``remat_policy`` knob of the
  factories: ``hk.remat``, ``nnx.remat``, ``eqx.filter_checkpoint``, penzai's
  ``Checkpointed``), whose peak is :func:`remat_opt.peak_bytes`, whose
  recompute is the jaxpr FLOPs of its gradient step over the plain one
  (:func:`remat_opt.memory._measure.gradient_flops`, as experiments/libraries.py),
  and whose gradients are checked against the plain step's.

``grad_error`` is the largest gradient difference as a fraction of the
rtol 1e-5 / atol 1e-6 tolerance (at most 1: equal). One row per program,
budget and method goes to ``<out>/library_remat.csv``, stamped with the jax
version and the machine. Then a table: per program and budget, remat_opt's
recompute beside the best baseline that fits (the fewest recomputed FLOPs among
those whose XLA peak is at most the budget) and the best per-block library
remat that fits, and whether a refusal came at a budget some baseline reaches.

These are held-out programs: nothing of remat_opt may be tuned on what this
prints (see heldout_programs).

Usage:
    python experiments/library_remat.py [--programs haiku_vgg,flax_nnx_vit] [--fractions 0.8,0.6,0.4]
        [--policies nothing_saveable,dots_saveable] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

import remat_opt
from remat_opt.memory import gradient_flops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv
from heldout import NO_BUDGET, SCHEDULES, SOLVER, source
from heldout_programs import PROGRAMS, Program

FRACTIONS = (0.8, 0.6, 0.4)
# Each library program, and its own per-block remat (the factory's remat_policy knob).
LIBRARY_REMAT = {"haiku_vgg": "hk.remat", "flax_nnx_vit": "nnx.remat",
                 "equinox_transformer": "eqx.filter_checkpoint", "penzai_decoder": "pz Checkpointed"}
COLUMNS = ("program", "fraction", "budget", "method", "kind", "xla_peak", "fits", "recompute_flops_pct",
           "grad_error", "min_budget_bytes", "plain_peak", "plain_flops", "status", "seconds", "exception")


def gradients(loss: Callable[..., Any], program: Program) -> Any:
    """The gradient of ``loss`` at the program's arguments: ``jax.grad``, or Equinox's
    filtered one when some leaf is static (an eqx.Module's functions)."""
    if all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(program.args)):
        return jax.jit(jax.grad(loss, argnums=program.argnums))(*program.args)
    import equinox as eqx

    return eqx.filter_jit(eqx.filter_grad(loss))(*program.args)


def grad_error(got: Any, want: Any) -> float:
    """:func:`grad_error_over_tolerance` on the floating array leaves (Equinox's gradient
    keeps ``None`` where a leaf is static)."""
    def arrays(tree: Any) -> list:
        return [x for x in jax.tree.leaves(tree) if hasattr(x, "dtype")]

    return grad_error_over_tolerance(arrays(got), arrays(want))


def failed(row: dict, err: BaseException) -> dict:
    print(f"  {row['method']}: {type(err).__name__}", flush=True)
    traceback.print_exception(err, file=sys.stdout)
    return {**row, "status": "EXCEPTION", "exception": f"{type(err).__name__}: {err}"[:500]}


def baselines(name: str, program: Program, plain_flops: int, policies: tuple[str, ...],
              want: Any) -> list[dict]:
    """Every baseline of one program, measured once: peak, recompute over the plain step, gradients."""
    loss, args, nums = program.loss, program.args, program.argnums
    rows = []

    def plan_row(kind: str, method: str, make: Callable[[], remat_opt.Plan]) -> dict:
        row = {"program": name, "kind": kind, "method": method}
        start = time.perf_counter()
        try:
            plan = make()
        except Exception as err:  # noqa: BLE001 - recorded with its traceback; the run goes on
            return failed(row, err)
        return {**row, "xla_peak": plan.measured_peak_bytes, "status": plan.status,
                "recompute_flops": plan.measured_recompute_flops, "seconds": round(time.perf_counter() - start, 1)}

    call = remat_opt.BaselineCall(loss, tuple(args), budget_bytes=NO_BUDGET, argnums=nums)
    for method, fn in SCHEDULES.items():
        rows.append(plan_row("schedule", method, lambda fn=fn: fn(call)))
    for policy in policies:
        rows.append(plan_row("policy", f"checkpoint/{policy}",
                             lambda policy=policy: remat_opt.checkpoint_policy(call, policy)))
    library = LIBRARY_REMAT[name]
    for policy in policies:
        row = {"program": name, "kind": "library", "method": f"{library}/{policy}"}
        start = time.perf_counter()
        try:
            variant = PROGRAMS[name](remat_policy=policy)
            row.update(
                xla_peak=remat_opt.peak_bytes(variant.loss, *variant.args, argnums=variant.argnums),
                recompute_flops=gradient_flops(variant.loss, variant.args, {}, variant.argnums) - plain_flops,
                grad_error=grad_error(gradients(variant.loss, variant), want),
                status="BASELINE")
        except Exception as err:  # noqa: BLE001 - recorded with its traceback; the run goes on
            row = failed(row, err)
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
    for row in rows:
        if row.get("xla_peak") is not None:
            grad = "" if row.get("grad_error") is None else f", gradient error {row['grad_error']:.2g} x tol"
            print(f"  {row['method']:44s} {row['xla_peak'] / MiB:8.2f} MiB "
                  f"+{100 * row['recompute_flops'] / plain_flops:5.1f}% FLOPs{grad}, {row['seconds']:.0f} s", flush=True)
    return rows


def run_program(name: str, fractions: tuple[float, ...], policies: tuple[str, ...]) -> list[dict]:
    start = time.perf_counter()
    try:
        program = PROGRAMS[name]()
        loss, args, nums = program.loss, program.args, program.argnums
        plain = remat_opt.no_remat(remat_opt.BaselineCall(loss, tuple(args), budget_bytes=NO_BUDGET,
                                                                argnums=nums))
        want = gradients(loss, program)
    except Exception as err:  # noqa: BLE001 - a missing library, say: a row says so, the run goes on
        return [failed({"program": name, "kind": "plain", "method": "no_remat"}, err)]
    plain_peak, plain_flops = plain.plain_peak_bytes, plain.baseline_flops
    print(f"{name}: {program.description}\n  plain peak {plain_peak / MiB:.2f} MiB", flush=True)
    measured = [{"program": name, "kind": "plain", "method": "no_remat", "xla_peak": plain_peak,
                 "recompute_flops": 0, "status": plain.status}]
    measured += baselines(name, program, plain_flops, policies, want)

    rows = []
    for fraction in fractions:
        budget = int(fraction * plain_peak)
        common = {"fraction": fraction, "budget": budget, "plain_peak": plain_peak, "plain_flops": plain_flops}
        for m in measured:
            rows.append({**m, **common, "fits": None if m.get("xla_peak") is None else m["xla_peak"] <= budget,
                         "recompute_flops_pct": (None if m.get("recompute_flops") is None
                                                 else 100 * m["recompute_flops"] / plain_flops)})
        row = {"program": name, "kind": "plan", "method": "remat_opt", **common}
        t = time.perf_counter()
        try:
            step = remat_opt.optimize(loss, budget, argnums=nums, solver_options=SOLVER)
            plan = step.plan(*args)
            row.update(xla_peak=plan.measured_peak_bytes, fits=plan.fits, status=plan.status,
                       recompute_flops_pct=100 * plan.measured_recompute_flops / plain_flops,
                       grad_error=grad_error(gradients(step, program), want))
        except remat_opt.InfeasibleBudgetError as err:
            row.update(status="INFEASIBLE", min_budget_bytes=err.min_budget_bytes)
        except Exception as err:  # noqa: BLE001 - recorded with its traceback; the run goes on
            row = failed(row, err)
        row["seconds"] = round(time.perf_counter() - t, 1)
        if row.get("min_budget_bytes"):
            outcome = f"refused, min budget {row['min_budget_bytes'] / MiB:.2f} MiB"
        elif row.get("xla_peak"):
            outcome = (f"{row['xla_peak'] / MiB:.2f} MiB, +{row['recompute_flops_pct']:.1f}% FLOPs, "
                       f"gradient error {row['grad_error']:.2g} x tol")
        else:
            outcome = row.get("exception", "")
        print(f"  remat_opt at {fraction:.1f} ({budget / MiB:.2f} MiB): {outcome}, {row['seconds']:.0f} s", flush=True)
        rows.append(row)
    print(f"  {name} done in {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def best(rows: list[dict], kinds: tuple[str, ...]) -> dict | None:
    """The row of ``kinds`` that fits with the fewest recomputed FLOPs (ties: the lower peak)."""
    fitting = [r for r in rows if r["kind"] in kinds and r.get("fits") and r.get("recompute_flops_pct") is not None]
    return min(fitting, key=lambda r: (r["recompute_flops_pct"], r["xla_peak"]), default=None)


def table(rows: list[dict]) -> str:
    """Per program and budget: remat_opt against the best fitting baseline and per-block remat."""
    def cell(r: dict | None) -> str:
        return "none fits" if r is None else f"{r['method']} {r['xla_peak'] / MiB:.2f} MiB +{r['recompute_flops_pct']:.1f}%"

    header = (f"{'program':20s} {'frac':>4s} {'budget MiB':>10s} | {'remat_opt':34s} | {'best baseline that fits':52s} | "
              f"{'best library per-block remat that fits':52s} | verdict")
    lines = [header]
    keys = dict.fromkeys((r["program"], r["fraction"]) for r in rows if r.get("fraction") is not None)
    for program, fraction in keys:
        group = [r for r in rows if r["program"] == program and r.get("fraction") == fraction]
        ours = next(r for r in group if r["kind"] == "plan")
        base = best(group, ("schedule", "policy", "library"))
        lib = best(group, ("library",))
        lowest = min((r["xla_peak"] for r in group if r["kind"] not in ("plan",) and r.get("xla_peak")), default=None)
        if ours.get("min_budget_bytes"):
            mine = f"refused (min {ours['min_budget_bytes'] / MiB:.2f} MiB)"
            verdict = ("REFUSED ABOVE a baseline's peak" if base is not None
                       else f"refusal justified (lowest baseline peak {lowest / MiB:.2f} MiB)")
        elif ours.get("xla_peak") is None:
            mine, verdict = "EXCEPTION", "EXCEPTION"
        else:
            mine = f"{ours['xla_peak'] / MiB:.2f} MiB +{ours['recompute_flops_pct']:.1f}%"
            if not ours["fits"]:
                verdict = "OVER BUDGET"
            elif base is None:
                verdict = "wins (no baseline fits)"
            elif ours["recompute_flops_pct"] <= base["recompute_flops_pct"]:
                verdict = "wins" if ours["recompute_flops_pct"] < base["recompute_flops_pct"] else "ties"
            else:
                verdict = f"LOSES to {base['method']}"
        lines.append(f"{program:20s} {fraction:4.1f} {ours['budget'] / MiB:10.2f} | {mine:34s} | {cell(base):52s} | "
                     f"{cell(lib):52s} | {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    split = lambda s: [p for p in s.split(",") if p]
    parser.add_argument("--programs", type=split, default=list(LIBRARY_REMAT),
                        help=f"comma-separated, of: {', '.join(LIBRARY_REMAT)}")
    parser.add_argument("--fractions", type=lambda s: tuple(float(f) for f in split(s)), default=FRACTIONS)
    parser.add_argument("--policies", type=split, default=list(remat_opt.POLICIES),
                        help=f"of: {', '.join(remat_opt.POLICIES)}")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    unknown = [n for n in args.programs if n not in LIBRARY_REMAT] + [p for p in args.policies
                                                                        if p not in remat_opt.POLICIES]
    if unknown:
        parser.error(f"unknown programs or policies {unknown}")
    header = f"{stamp()}\n{source()}\nreproduce: {command()}\nsolver: {SOLVER}"
    print(header, flush=True)
    cache = None
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        cache = tempfile.mkdtemp(prefix="library_remat_xla_")
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    path = args.out / "library_remat.csv"
    start = time.perf_counter()
    rows: list[dict] = []
    for name in args.programs:
        rows += run_program(name, args.fractions, tuple(args.policies))
        write_csv(path, [{c: r.get(c) for c in COLUMNS} for r in rows], header)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"\n{table(rows)}\n\nwall time {(time.perf_counter() - start) / 60:.1f} min; wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
