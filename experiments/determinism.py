"""Plans are deterministic: the same program and budget, planned in separate processes.

Plans the zoo GPT (unrolled, ``--layers`` blocks) at ``--fraction`` of its plain
peak in ``--runs`` fresh Python processes, with the plan cache off and the
default solver options, and compares what they return: the schedule (or loop
plan), XLA's peak and the recomputed FLOPs. The processes run one after the
other, while the machine does whatever else it is doing: CP-SAT's limits are
deterministic, so load must not change the plan.

Usage:
    python experiments/determinism.py [--layers 4 16] [--runs 2] [--fraction 0.6]

Writes ``experiments/results/determinism.csv``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, stamp, write_csv  # noqa: E402

CHILD = """
import json, sys, jax, remat_opt
from remat_opt.zoo import gpt
layers, fraction = int(sys.argv[1]), float(sys.argv[2])
params, batch = gpt.init(gpt.GPTConfig(num_layers=layers, d_model=64, num_heads=4, seq_len=64, batch=4,
                                       vocab=128), jax.random.key(0))
budget = int(remat_opt.peak_bytes(gpt.loss, params, batch) * fraction)
plan = remat_opt.optimize(gpt.loss, budget, cache=False).plan(params, batch)
decisions = plan.schedule.to_json() if plan.loop_plan is None else repr(plan.loop_plan)
print(json.dumps({"budget": budget, "decisions": decisions, "measured": plan.measured_peak_bytes,
                  "flops": plan.measured_recompute_flops, "status": plan.status}))
"""


def run(layers: int, fraction: float) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(fraction)], check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # A search the wall clock stopped (a loaded machine) is logged; the plan may then differ.
    result["wall_clock_stops"] = done.stderr.count("wall-clock cap")
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["digest"] = hashlib.sha256(result.pop("decisions").encode()).hexdigest()[:16]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--fraction", type=float, default=0.6)
    args = parser.parse_args()
    rows, same = [], True
    for layers in args.layers:
        results = [run(layers, args.fraction) for _ in range(args.runs)]
        for i, r in enumerate(results):
            rows.append({"layers": layers, "run": i, **r})
            print(f"{layers} layers, run {i}: plan {r['digest']}, XLA {r['measured']:,} bytes, "
                  f"+{r['flops']:,} FLOPs, {r['status']}, {r['seconds']} s, "
                  f"{r['wall_clock_stops']} solves stopped by the wall clock", flush=True)
        identical = len({(r["digest"], r["measured"], r["flops"]) for r in results}) == 1
        same &= identical
        print(f"{layers} layers: {'identical' if identical else 'DIFFERENT'} plans in {args.runs} processes")
    write_csv(RESULTS / "determinism.csv", rows, f"{stamp()}; {command()}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
