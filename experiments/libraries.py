"""Flax and Equinox: the scan GPT of the library tests at 12 layers, through their usual steps.

The Flax Linen (``nn.scan`` over blocks) and Equinox (``lax.scan`` over
``eqx.filter_vmap``-stacked blocks) decoders of ``tests/test_libraries.py``,
built at ``--layers`` layers and ``--d-model`` width, are optimized at three
budgets below their plain peak. Each row: XLA's measured peak against the
budget, the recomputed FLOPs, which plan won (the unrolled schedule or a loop
plan, whose peaks equal the hand-written ``jax.checkpoint``-on-the-body and
nested-scan alternatives, see ``experiments/scan.py``), and the gradient error
against the library's own plain step, as a fraction of the rtol 1e-5 /
atol 1e-6 tolerance.

Usage:
    python experiments/libraries.py [--layers 12] [--d-model 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import jax

import remat_opt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests" / "test_libraries.py"


def _models(layers: int, d_model: int):
    spec = importlib.util.spec_from_file_location("library_models", TESTS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (eqx.Module) look their module up
    spec.loader.exec_module(module)
    module.LAYERS, module.D_MODEL, module.SEQ, module.BATCH, module.VOCAB = layers, d_model, 128, 4, 256
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.6, 0.4, 0.25])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    header = f"{stamp()}\nreproduce: {command()}"
    print(header, flush=True)
    m = _models(args.layers, args.d_model)
    import equinox as eqx

    x, y = m.tokens()
    flax_model = m.flax_gpt(scan=True)
    flax_params = flax_model.init(jax.random.PRNGKey(0), x)["params"]

    def flax_loss(params, batch):
        return m.cross_entropy(flax_model.apply({"params": params}, batch[0]), batch[1])

    _, eqx_model = m.eqx_gpt()
    cases = {
        "flax": (flax_loss, (flax_params, (x, y)),
                 lambda step: jax.jit(jax.grad(step))(flax_params, (x, y))),
        "equinox": (m.eqx_loss, (eqx_model, x, y),
                    lambda step: eqx.filter_jit(eqx.filter_grad(step))(eqx_model, x, y)),
    }
    rows = []
    for name, (loss, call_args, grad_of) in cases.items():
        plain = remat_opt.peak_bytes(loss, *call_args)
        want = grad_of(loss)
        print(f"{name}: plain {plain / MiB:.2f} MiB", flush=True)
        for frac in args.fractions:
            budget = int(plain * frac)
            start = time.perf_counter()
            step = remat_opt.optimize(loss, budget)
            plan = step.plan(*call_args)
            wall = time.perf_counter() - start
            kind = str(plan.loop_plan) if plan.loop_plan is not None else f"unrolled, {plan.num_segments} segments"
            row = {"library": name, "budget_bytes": budget, "plain_peak_bytes": plain,
                   "measured_peak_bytes": plan.measured_peak_bytes, "predicted_peak_bytes": plan.predicted_peak_bytes,
                   "overhead": plan.measured_recompute_flops / plan.baseline_flops, "plan": kind,
                   "grad_error_over_tolerance": grad_error_over_tolerance(grad_of(step), want), "wall_seconds": round(wall, 1)}
            rows.append(row)
            print(f"  {budget / MiB:8.2f} MiB: measured {plan.measured_peak_bytes / MiB:8.2f}, "
                  f"+{row['overhead']:.1%}, {kind}, gradient error {row['grad_error_over_tolerance']:.2f}, "
                  f"{wall:.0f}s", flush=True)
    write_csv(args.out / "libraries.csv", rows, header)
    ok = all(r["measured_peak_bytes"] <= r["budget_bytes"] and r["grad_error_over_tolerance"] <= 1 for r in rows)
    print("every budget met, gradients equal the library's plain step" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
