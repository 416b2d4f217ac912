"""A zoo GPT plan as a person reads it: the report, the plot, the DOT graph, and the cache.

Plans the zoo's 8-layer GPT (its default config) at a fraction of its plain peak,
prints ``Plan.report()``, saves ``Plan.plot()`` (experiments/results/plan_plot.png)
and, with ``--dot``, the plan graph as DOT. Then a second Python process plans
the same program and budget with the same plan cache and reports how long its
``plan()`` took against the first (it loads the plan: no solve, no candidate
compiled).

    python experiments/lab/plan_report.py [--fraction 0.5] [--out experiments/results/plan_plot.png] [--dot plan.dot]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

import remat_opt
from remat_opt.zoo import MODELS

RESULTS = Path(__file__).resolve().parents[1] / "results"  # experiments/results/, one up from lab/


def timed_plan(model: str, fraction: float, cache: str) -> tuple[remat_opt.Plan, float]:
    """The plan at ``fraction`` of the model's plain peak, and the seconds ``plan()`` took."""
    spec = MODELS[model]
    params, batch = spec.init(spec.default_config, jax.random.PRNGKey(0))
    budget = int(fraction * remat_opt.peak_bytes(spec.loss, params, batch))
    step = remat_opt.optimize(spec.loss, budget, cache=cache)
    start = time.perf_counter()
    plan = step.plan(params, batch)
    return plan, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=sorted(MODELS))
    parser.add_argument("--fraction", type=float, default=0.5, help="budget as a fraction of the plain peak")
    parser.add_argument("--out", default=str(RESULTS / "plan_plot.png"), help="where to save the plot")
    parser.add_argument("--dot", help="also write the plan graph as DOT here")
    parser.add_argument("--cache-dir", help="plan cache folder (default: a new temporary one, so the first plan "
                        "is made, not loaded)")
    parser.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)  # the second process
    args = parser.parse_args(argv)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="remat_opt_plans_")
    plan, seconds = timed_plan(args.model, args.fraction, cache)
    if args.load_only:
        print(json.dumps({"seconds": seconds, "schedule": plan.schedule.to_json()}))
        return 0
    print(plan.report())
    plan.plot(args.out)
    print(f"plot: {args.out}")
    if args.dot:
        plan.to_dot(args.dot)
        print(f"DOT: {args.dot}")
    second = subprocess.run([sys.executable, __file__, "--model", args.model, "--fraction", str(args.fraction),
                             "--cache-dir", cache, "--load-only"], check=True, capture_output=True, text=True)
    loaded = json.loads(second.stdout.strip().splitlines()[-1])
    assert loaded["schedule"] == plan.schedule.to_json(), "the second process got another plan"
    print(f"plan(): {seconds:.1f} s in this process; {loaded['seconds']:.2f} s in a second process with the same "
          f"plan cache ({loaded['seconds'] / seconds:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
