"""The demo: optimize an embedded zoo model at several budgets and print the evidence.

Each row is a plan: its budget, the model's prediction and XLA's measurement of
its peak, what it recomputes, and its gradients checked against plain
``jax.grad``. A legend says what the columns mean; a closing summary says
whether every budget was met and every gradient matched.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from ._api import optimize
from ._budget import format_bytes
from ._errors import RematOptError
from .memory._measure import peak_bytes
from .zoo import MODELS

GRAD_TOLERANCE = 1e-5
"""Largest difference from ``jax.grad``'s gradients, relative to their largest entry, that
counts as equal: recomputing reorders no arithmetic, but XLA may fuse it otherwise."""

HEADER = (f"{'budget':>11} {'predicted':>11} {'measured':>11} {'recompute':>9} {'grad err':>9} {'solve s':>8} "
          f"{'total s':>8}  status")

LEGEND = """\
  budget     the memory budget: this share of the plain peak
  predicted  peak remat_opt's model predicts for the plan ("-" for a JAX policy, which it does not model)
  measured   XLA's peak for jax.jit(jax.value_and_grad(step)): arguments + outputs + temporaries
  recompute  FLOPs recomputed, as a share of the plain gradient step's
  grad err   largest |gradient - jax.grad's|, relative to jax.grad's largest entry
  solve s    seconds in CP-SAT; total s: the whole plan (trace, solves, XLA compiles, checks)
  status     OPTIMAL or FEASIBLE (CP-SAT's gap), PLAIN (fits as written) or BASELINE"""


def _grad_error(got: Any, want: Any) -> float:
    """Largest absolute difference between two gradient pytrees, relative to ``want``'s largest entry."""
    diff = max(float(jnp.max(jnp.abs(g - w))) for g, w in zip(jax.tree_util.tree_leaves(got),
                                                                 jax.tree_util.tree_leaves(want)))
    scale = max(float(jnp.max(jnp.abs(w))) for w in jax.tree_util.tree_leaves(want))
    return diff / scale if scale else diff


def run(model: str = "gpt", fractions: tuple[float, ...] = (0.9, 0.75, 0.6, 0.5, 0.4),
        config: Any = None) -> list[dict]:
    """Optimizes a zoo model at budgets given as fractions of its plain peak.

    Args:
        model: a key of ``remat_opt.zoo.MODELS``.
        fractions: budgets as fractions of XLA's peak for the plain gradient.
        config: the model's sizes; ``None``: its ``default_config``.

    Returns:
        One row per budget planned: budget, predicted, measured and plain peak,
        recompute overhead, gradient error against ``jax.grad``, solve and total
        time, status; ``ok`` when the budget was met and the gradients matched.
    """
    spec = MODELS[model]
    config = spec.default_config if config is None else config
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    plain = peak_bytes(spec.loss, params, batch)
    want = jax.jit(jax.grad(spec.loss))(params, batch)
    print(f"{model}: {config}")
    print(f"plain gradient step peak (XLA): {format_bytes(plain)}; jax {jax.__version__}, {jax.devices()[0].platform}")
    print(LEGEND)
    print(HEADER, flush=True)
    rows = []
    started = time.perf_counter()
    for frac in fractions:
        budget = int(plain * frac)
        start = time.perf_counter()
        try:
            step = optimize(spec.loss, budget)
            plan = step.plan(params, batch)
        except RematOptError as err:
            print(f"{format_bytes(budget):>11}  {type(err).__name__}: {err}", flush=True)
            continue
        error = _grad_error(jax.jit(jax.grad(step))(params, batch), want)
        row: dict[str, Any] = dict(
            budget=budget, predicted=plan.predicted_peak_bytes, measured=plan.measured_peak_bytes,
            plain=plain, overhead=plan.recompute_overhead, grad_error=error, solve_s=plan.solve_seconds,
            status=plan.status_text, total_s=time.perf_counter() - start)
        row["ok"] = row["measured"] <= budget and error <= GRAD_TOLERANCE
        rows.append(row)
        predicted = "-" if row["predicted"] is None else format_bytes(row["predicted"])
        print(f"{format_bytes(budget):>11} {predicted:>11} {format_bytes(row['measured']):>11} "
              f"{row['overhead']:>9.1%} {error:>9.1e} {row['solve_s']:>8.1f} {row['total_s']:>8.1f}  "
              f"{row['status']}", flush=True)
    print(summary(rows, len(fractions), time.perf_counter() - started), flush=True)
    return rows


def summary(rows: list[dict], asked: int, seconds: float) -> str:
    """The closing line: budgets met on XLA, gradients against ``jax.grad``, time."""
    met = sum(r["measured"] <= r["budget"] for r in rows)
    matched = sum(r["grad_error"] <= GRAD_TOLERANCE for r in rows)
    worst = max((r["grad_error"] for r in rows), default=0.0)
    refused = asked - len(rows)
    return (f"{met} of {asked} budgets met on XLA{f' ({refused} refused)' if refused else ''}; gradients equal to "
            f"jax.grad's in {matched} of {len(rows)} (largest relative difference {worst:.1e}, tolerance "
            f"{GRAD_TOLERANCE:.0e}); {seconds:.0f} s in all.")
