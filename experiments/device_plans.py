"""Two plans on the device at hand, as a user meets them, without baselines.

``jit``: the zoo GPT (4 layers, the step-time table's widths) planned at half of its plain peak
the way the README writes it: ``jax.jit(jax.value_and_grad(remat_opt.optimize(loss, budget)))``
called with no ``step.plan(...)`` first, so the plan is made while ``jit`` traces. Prints the
first call's seconds (plan, compile, run), XLA's peak of the jitted step against the budget, the
largest gradient difference from the plain step's, the median step and the plan.

``refusal``: the zoo ResNet at half of its plain peak, which no per-layer plan reaches on a TPU:
prints the refusal and how long it took.

Usage::

    python experiments/device_plans.py jit [--tiny]
    python experiments/device_plans.py refusal

``--tiny`` runs ``jit`` at CPU sizes (0.95 of plain: the tiny model's parameters dominate).
Session 47's TPU runs: ``results/tpu_logs/jit_check_s47.log``, ``resnet_refusal_s47.log``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import jax
import jax.numpy as jnp

import remat_opt
from remat_opt.zoo import MODELS, GPTConfig, ResNetConfig

GPT4 = GPTConfig(num_layers=4, d_model=768, num_heads=12, seq_len=1024, batch=4, vocab=8192)
TINY = GPTConfig(num_layers=3, d_model=32, num_heads=2, seq_len=16, batch=2, vocab=64)
RESNET = ResNetConfig(image_size=64, widths=(64, 128, 256), blocks_per_stage=2, batch=64)


def planned_under_jit(tiny: bool) -> None:
    """The ``jit`` check (module docstring)."""
    spec = MODELS["gpt"]
    params, batch = spec.init(TINY if tiny else GPT4, jax.random.key(0))
    plain = remat_opt.peak_bytes(spec.loss, params, batch)
    budget = int((0.95 if tiny else 0.5) * plain)
    print("jax", jax.__version__, jax.devices()[0].device_kind, "plain peak", plain, "budget", budget, flush=True)
    optimized = remat_opt.optimize(spec.loss, budget, cache=False)
    step = jax.jit(jax.value_and_grad(optimized))
    started = time.perf_counter()
    value, grads = jax.block_until_ready(step(params, batch))
    print("first call under jit (plan + compile + run) s", round(time.perf_counter() - started, 1), flush=True)
    peak = remat_opt.peak_bytes(optimized, params, batch)  # the plan made under jit, compiled again
    _, want = jax.jit(jax.value_and_grad(spec.loss))(params, batch)
    error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want)))
    times = []
    for _ in range(6):
        started = time.perf_counter()
        jax.block_until_ready(step(params, batch))
        times.append(time.perf_counter() - started)
    print("peak", peak, "fits", peak <= budget, "max |grad diff|", error, "loss", float(value),
          "median ms", round(1e3 * statistics.median(times[1:]), 3), flush=True)
    print(optimized.plan(params, batch), flush=True)  # the same plan, not made again


def refused_in_time() -> None:
    """The ``refusal`` check (module docstring)."""
    spec = MODELS["resnet"]
    params, batch = spec.init(RESNET, jax.random.key(0))
    plain = remat_opt.peak_bytes(spec.loss, params, batch)
    started = time.perf_counter()
    try:
        print(remat_opt.optimize(spec.loss, int(0.5 * plain), cache=False).plan(params, batch))
    except remat_opt.InfeasibleBudgetError as refused:
        print("REFUSED", refused)
    print("plain", plain, "plan s", round(time.perf_counter() - started, 1), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("jit", "refusal"))
    parser.add_argument("--tiny", action="store_true", help="jit at CPU sizes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.check == "jit":
        planned_under_jit(args.tiny)
    else:
        refused_in_time()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
