"""Flax and Equinox: the scan GPT of the library tests at 12 layers, against the checkpoints users write.

The Flax Linen (``nn.scan`` over blocks) and Equinox (``lax.scan`` over
``eqx.filter_vmap``-stacked blocks) decoders of ``tests/test_libraries.py``,
built at ``--layers`` layers and ``--d-model`` width. First every hand-written
alternative a user of the library would write, through the library's own API,
is measured: Flax ``nn.remat`` around the scanned block with each of JAX's
built-in policies, and ``nn.remat_scan`` in 3 or 4 checkpointed groups (of the
block as written or under ``nn.remat``); Equinox ``eqx.filter_checkpoint``
around the scan body with each policy, and the scan nested in 3 or 4
``eqx.filter_checkpoint``-ed groups. Each: XLA's peak
(:func:`remat_opt.peak_bytes`), the FLOPs it recomputes over the plain step
(:func:`remat_opt.memory._measure.gradient_flops`), and its gradients against the
plain step's.

Then remat_opt is asked for budgets below the plain peak: ``--fractions`` of
it, and the peaks of the hand-written alternatives no other one beats (fewer
recomputed FLOPs at no higher peak), so each is compared at its own peak. At
each budget remat_opt's measured peak and recomputed FLOPs are put beside the
best hand-written alternative that fits (the fewest recomputed FLOPs among
those whose measured peak is at most the budget), with its gradient error
against the library's own plain step as a fraction of the rtol 1e-5 /
atol 1e-6 tolerance.

Usage:
    python experiments/libraries.py [--layers 12] [--d-model 128] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

import remat_opt
from remat_opt.rewrite import near_sqrt_divisors
from remat_opt.memory import gradient_flops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests" / "test_libraries.py"

# A variant of a model: its loss, the arguments of its step, and the gradients of a loss
# with that signature through the library's own step, in the plain model's layout.
Variant = tuple[Callable[..., Any], tuple, Callable[[Callable[..., Any]], Any]]


def _models(layers: int, d_model: int):
    spec = importlib.util.spec_from_file_location("library_models", TESTS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (eqx.Module) look their module up
    spec.loader.exec_module(module)
    module.LAYERS, module.D_MODEL, module.SEQ, module.BATCH, module.VOCAB = layers, d_model, 128, 4, 256
    return module


def flax_variants(m) -> Callable[[str | None, int], Variant]:
    """The Flax GPT, plain (``policy=None, groups=1``) or checkpointed by hand."""
    x, y = m.tokens()
    params = m.flax_gpt(scan=True).init(jax.random.PRNGKey(0), x)["params"]

    def variant(policy: str | None, groups: int) -> Variant:
        model = m.flax_gpt(scan=True, checkpoint=None if policy is None else remat_opt.POLICIES[policy], groups=groups)
        own = params if groups == 1 else m.flax_grouped(params, groups)
        back = (lambda g: g) if groups == 1 else m.flax_ungrouped

        def loss(params, batch):
            return m.cross_entropy(model.apply({"params": params}, batch[0]), batch[1])

        return loss, (own, (x, y)), lambda step: back(jax.jit(jax.grad(step))(own, (x, y)))

    return variant


def eqx_variants(m) -> Callable[[str | None, int], Variant]:
    """The Equinox GPT, plain (``policy=None, groups=1``) or checkpointed by hand."""
    import equinox as eqx

    x, y = m.tokens()

    def variant(policy: str | None, groups: int) -> Variant:
        _, model = m.eqx_gpt(checkpoint=None if policy is None else remat_opt.POLICIES[policy], groups=groups)
        return m.eqx_loss, (model, x, y), lambda step: eqx.filter_jit(eqx.filter_grad(step))(model, x, y)

    return variant


def alternative_name(library: str, policy: str | None, groups: int) -> str:
    if library == "flax":
        block = "" if policy is None else f"nn.remat({policy})"
        if groups == 1:
            return block
        return "nn.remat_scan" + (f" of {block}" if block else "") + f", {groups} groups"
    body = "body" if policy is None else f"filter_checkpoint({policy}) body"
    return body + (f", {groups} checkpointed groups" if groups > 1 else "")


def hand_written(library: str, variant: Callable[[str | None, int], Variant], layers: int,
                 baseline_flops: int, want: Any, policies: tuple[str, ...] = tuple(remat_opt.POLICIES)) -> list[dict]:
    """Every hand-written alternative (of ``policies``), measured: peak, recomputed FLOPs, gradient error."""
    rows = []
    for policy in (None, *policies):
        for groups in (1, *sorted(near_sqrt_divisors(layers))):
            if policy is None and groups == 1:
                continue
            loss, args, grad_of = variant(policy, groups)
            start = time.perf_counter()
            recompute = gradient_flops(loss, args, {}, 0) - baseline_flops
            rows.append({
                "library": library, "strategy": alternative_name(library, policy, groups),
                "measured_peak_bytes": remat_opt.peak_bytes(loss, *args),
                "recompute_flops": recompute, "overhead": recompute / baseline_flops,
                "grad_error_over_tolerance": grad_error_over_tolerance(grad_of(loss), want),
                "wall_seconds": round(time.perf_counter() - start, 1),
            })
            r = rows[-1]
            print(f"  {r['strategy']:60s} {r['measured_peak_bytes'] / MiB:8.2f} MiB +{r['overhead']:.1%}, "
                  f"gradient error {r['grad_error_over_tolerance']:.2f}", flush=True)
    return rows


def frontier(rows: list[dict], plain: int) -> list[dict]:
    """The alternatives below the plain peak that no other beats: fewer recomputed
    FLOPs than every alternative at or under their peak."""
    kept, fewest = [], None
    for r in sorted(rows, key=lambda r: (r["measured_peak_bytes"], r["recompute_flops"])):
        if r["measured_peak_bytes"] < plain and (fewest is None or r["recompute_flops"] < fewest):
            kept.append(r)
            fewest = r["recompute_flops"]
    return kept


def best_fitting(rows: list[dict], budget: int) -> dict | None:
    """The alternative with the fewest recomputed FLOPs whose measured peak is at most ``budget``."""
    fitting = [r for r in rows if r["measured_peak_bytes"] <= budget]
    return min(fitting, key=lambda r: (r["recompute_flops"], r["measured_peak_bytes"]), default=None)


def remat_opt_row(loss: Callable[..., Any], call_args: tuple, grad_of: Callable[[Callable[..., Any]], Any],
                  want: Any, budget: int, options: remat_opt.SolverOptions, baseline_flops: int,
                  **optimize_kwargs: Any) -> dict:
    """remat_opt's plan at ``budget``, measured; a budget it cannot reach is a row too."""
    start = time.perf_counter()
    step = remat_opt.optimize(loss, budget, solver_options=options, **optimize_kwargs)
    try:
        plan = step.plan(*call_args)
    except remat_opt.InfeasibleBudgetError as err:
        return {"strategy": "remat_opt", "budget_bytes": budget, "measured_peak_bytes": None,
                "predicted_peak_bytes": None, "recompute_flops": None, "overhead": None,
                "plan": f"no plan: lowest peak {err.min_budget_bytes / MiB:.2f} MiB",
                "grad_error_over_tolerance": None, "wall_seconds": round(time.perf_counter() - start, 1)}
    wall = time.perf_counter() - start
    return {"strategy": "remat_opt", "budget_bytes": budget, "measured_peak_bytes": plan.measured_peak_bytes,
            "predicted_peak_bytes": plan.predicted_peak_bytes, "recompute_flops": plan.measured_recompute_flops,
            "overhead": plan.measured_recompute_flops / baseline_flops,
            "plan": str(plan.loop_plan) if plan.loop_plan is not None else f"unrolled, {plan.num_segments} segments",
            "grad_error_over_tolerance": grad_error_over_tolerance(grad_of(step), want), "wall_seconds": round(wall, 1)}


def _ours(row: dict) -> str:
    if row["measured_peak_bytes"] is None:
        return row["plan"]
    return f"{row['measured_peak_bytes'] / MiB:.2f}, +{row['overhead']:.1%}, {row['plan']}"


def _theirs(row: dict) -> str:
    if row["best_alternative"] is None:
        return "none fits"
    return (f"{row['best_alternative']}: {row['best_alternative_peak_bytes'] / MiB:.2f}, "
            f"+{row['best_alternative_overhead']:.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.6, 0.4, 0.25],
                        help="budgets as fractions of the plain peak, besides the alternatives' peaks")
    parser.add_argument("--quick", action="store_true",
                        help="nothing_saveable only; scans planned whole; a short solve")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    header = f"{stamp()}\nreproduce: {command()}"
    print(header, flush=True)
    m = _models(args.layers, args.d_model)
    options = (remat_opt.SolverOptions(time_limit_s=60, deterministic_time_limit=1.0, num_workers=2)
               if args.quick else remat_opt.SolverOptions())

    rows, table = [], []
    for library, variants in (("flax", flax_variants(m)), ("equinox", eqx_variants(m))):
        loss, call_args, grad_of = variants(None, 1)
        plain = remat_opt.peak_bytes(loss, *call_args)
        baseline_flops = gradient_flops(loss, call_args, {}, 0)
        want = grad_of(loss)
        print(f"{library}: plain {plain / MiB:.2f} MiB", flush=True)
        alternatives = hand_written(library, variants, args.layers, baseline_flops, want,
                                    ("nothing_saveable",) if args.quick else tuple(remat_opt.POLICIES))
        rows += [{"library": library, "strategy": "no remat", "measured_peak_bytes": plain, "recompute_flops": 0,
                  "overhead": 0.0}, *alternatives]
        budgets = {int(plain * frac) for frac in args.fractions}
        budgets |= {r["measured_peak_bytes"] for r in frontier(alternatives, plain)}
        for budget in sorted(budgets, reverse=True):
            row = remat_opt_row(loss, call_args, grad_of, want, budget, options, baseline_flops,
                                **({"unroll_scans": 0} if args.quick else {}))  # quick: scans planned whole
            best = best_fitting(alternatives, budget)
            row = {"library": library, **row, "plain_peak_bytes": plain,
                   "best_alternative": None if best is None else best["strategy"],
                   "best_alternative_peak_bytes": None if best is None else best["measured_peak_bytes"],
                   "best_alternative_overhead": None if best is None else best["overhead"],
                   "recompute_at_most_best_alternative": None if best is None else (
                       row["recompute_flops"] is not None and row["recompute_flops"] <= best["recompute_flops"])}
            rows.append(row)
            table.append(row)
            print(f"  {budget / MiB:8.2f} MiB: {_ours(row)}, gradient error {row['grad_error_over_tolerance']:.2f}, "
                  f"{row['wall_seconds']:.0f}s; best hand-written that fits: {_theirs(row)}", flush=True)

    write_csv(args.out / "libraries.csv", rows, header)
    print(f"\n{args.layers}-layer scan GPT, d_model {args.d_model}; {stamp()}")
    print("| library | budget MiB | remat_opt: measured MiB, extra FLOPs, plan | "
          "best hand-written that fits: measured MiB, extra FLOPs | remat_opt ≤ it |")
    print("|---|---:|---|---|---|")
    for r in table:
        verdict = {None: "", True: "yes", False: "**no**"}[r["recompute_at_most_best_alternative"]]
        print(f"| {r['library']} | {r['budget_bytes'] / MiB:.2f} | {_ours(r)} | {_theirs(r)} | {verdict} |")
    met = all(r["measured_peak_bytes"] is not None and r["measured_peak_bytes"] <= r["budget_bytes"] for r in table)
    grads = all(r.get("grad_error_over_tolerance") is None or r["grad_error_over_tolerance"] <= 1 for r in rows)
    worse = [(r["library"], round(r["budget_bytes"] / MiB, 2)) for r in table
             if r["recompute_at_most_best_alternative"] is False]
    print("every budget met, gradients equal the library's plain step" if met and grads else "FAILED")
    print("remat_opt recomputes no more than the best fitting hand-written alternative at every budget"
          if not worse else f"remat_opt recomputes more than the best fitting hand-written alternative at {worse} MiB")
    return 0 if met and grads and not worse else 1


if __name__ == "__main__":
    sys.exit(main())
