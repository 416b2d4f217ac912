"""A digest of the plans remat_opt makes for a few small programs, to show a refactor changes none.

Plans the zoo MLP, a small GPT and the GPT with its layers in one ``lax.scan`` at two
budgets each (fractions of the program's own peak), on this machine's backend with the
plan cache off, and prints one line per plan (its decisions, status and measured
figures) and a sha256 of all of them. Run it before and after a change that must not
move a plan; the outputs must be identical (same jax, same machine).
``--cache`` plans with the plan cache on, in a new folder, then loads each plan back in
a new ``optimize``: the made plan's line and the loaded one's are printed (the persistent
cache's path, :mod:`remat_opt.cache._restore`).

    PYTHONPATH=src python experiments/lab/plan_digest.py [--cache]
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import shutil
import sys
import tempfile
import time

import jax

import remat_opt
from remat_opt.zoo import GPTConfig, MLPConfig, gpt, init_gpt, init_mlp, mlp_loss



def programs() -> list[tuple[str, object, tuple, tuple[float, ...]]]:
    """(name, loss, arguments, budgets as shares of its peak as written) of each program planned."""
    mlp_params, mlp_batch = init_mlp(MLPConfig(depth=8, width=128, batch=512), jax.random.key(0))
    config = GPTConfig(num_layers=4, d_model=64, num_heads=2, seq_len=64, batch=2, vocab=128)
    gpt_params, gpt_batch = init_gpt(config, jax.random.key(1))
    small = GPTConfig(num_layers=3, d_model=32, num_heads=2, seq_len=32, batch=2, vocab=64)
    scan_params, scan_batch = init_gpt(small, jax.random.key(2))
    return [("mlp", mlp_loss, (mlp_params, mlp_batch), (0.9, 0.8)),
            ("gpt", gpt.loss, (gpt_params, gpt_batch), (0.8, 0.6)),
            ("gpt_scan", gpt.scan_loss, (gpt.stack_layers(scan_params), scan_batch), (0.6,))]


def digest(plan: remat_opt.Plan) -> dict:
    """What a plan decided and measured (no timings)."""
    return {"schedule": None if plan.schedule is None else json.loads(plan.schedule.to_json()),
            "loop_plan": None if plan.loop_plan is None else repr(plan.loop_plan),
            "layer_plan": None if plan.layer_plan is None else repr(plan.layer_plan),
            "whole_policy": plan.whole_policy, "status": plan.status, "strategy": plan.strategy,
            "measured_peak_bytes": plan.measured_peak_bytes, "predicted_peak_bytes": plan.predicted_peak_bytes,
            "plain_peak_bytes": plan.plain_peak_bytes, "recompute_flops": plan.recompute_flops,
            "measured_recompute_flops": plan.measured_recompute_flops, "computed_once": plan.computed_once,
            "attempts": plan.attempts}


def plans(loss, budget: int, args: tuple, folder: str | None) -> list[dict]:
    """The digest of the plan of ``loss`` at ``budget`` (with the cache in ``folder``: made, then loaded)."""
    found = []
    for _ in range(1 if folder is None else 2):
        try:
            found.append(digest(remat_opt.optimize(loss, budget, cache=folder or False).plan(*args)))
        except remat_opt.InfeasibleBudgetError as err:
            found.append({"refused": err.min_budget_bytes})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", action="store_true",
                        help="plan with the plan cache on, then load each plan back and print it too")
    folder = tempfile.mkdtemp(prefix="plan_digest_") if parser.parse_args(argv).cache else None
    if folder is not None:
        atexit.register(shutil.rmtree, folder, True)
    lines = []
    for name, loss, args, fractions in programs():
        peak = remat_opt.peak_bytes(loss, *args)
        for fraction in fractions:
            started = time.perf_counter()
            budget = int(peak * fraction)
            for k, found in enumerate(plans(loss, budget, args, folder)):
                line = f"{name} {fraction} {budget}{' loaded' if k else ''} " + json.dumps(found, sort_keys=True)
                lines.append(line)
                print(line, flush=True)
            print(f"  ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    print("digest", hashlib.sha256("\n".join(lines).encode()).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
