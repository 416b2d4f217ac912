"""The demo: optimize the embedded GPT at several budgets and print the evidence."""

from __future__ import annotations

import time
from typing import Any

import jax

from ._budget import format_bytes
from ._errors import RematOptError
from .memory._measure import peak_bytes
from ._api import optimize
from .zoo import MODELS


def run(model: str = "gpt", fractions: tuple[float, ...] = (0.9, 0.75, 0.6, 0.5, 0.4)) -> list[dict]:
    """Optimizes a zoo model at budgets given as fractions of its plain peak.

    Args:
        model: a key of ``remat_opt.zoo.MODELS``.
        fractions: budgets as fractions of XLA's peak for the plain gradient.

    Returns:
        One row per budget: budget, predicted, measured and plain peak,
        recompute overhead, solve time and status.
    """
    spec = MODELS[model]
    params, batch = spec.init(spec.default_config, jax.random.PRNGKey(0))
    plain = peak_bytes(spec.loss, params, batch)
    print(f"{model}: {spec.default_config}")
    print(f"plain gradient step peak (XLA): {format_bytes(plain)}; jax {jax.__version__}, {jax.devices()[0].platform}")
    header = (f"{'budget':>11} {'predicted':>11} {'measured':>11} {'plain':>11} {'recompute':>9} {'solve s':>8} "
              f"{'total s':>8}  status")
    print(header, flush=True)
    rows = []
    for frac in fractions:
        budget = int(plain * frac)
        start = time.perf_counter()
        try:
            plan = optimize(spec.loss, budget).plan(params, batch)
        except RematOptError as err:
            print(f"{format_bytes(budget):>11}  {type(err).__name__}: {err}", flush=True)
            continue
        row: dict[str, Any] = dict(
            budget=budget, predicted=plan.predicted_peak_bytes, measured=plan.measured_peak_bytes,
            plain=plain, overhead=plan.recompute_overhead, solve_s=plan.solve_seconds,
            status=plan.status_text,
            total_s=time.perf_counter() - start)
        rows.append(row)
        print(f"{format_bytes(budget):>11} {'-' if row['predicted'] is None else format_bytes(row['predicted']):>11} {format_bytes(row['measured']):>11} "
              f"{format_bytes(plain):>11} {row['overhead']:>8.1%} {row['solve_s']:>8.1f} {row['total_s']:>8.1f}  "
              f"{row['status']}", flush=True)
    return rows
