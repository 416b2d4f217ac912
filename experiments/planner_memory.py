"""The planner's memory and time against one plain compile, per process.

For the zoo's scanned GPT at each depth, two fresh processes run under
``/usr/bin/time -v``: one compiles the plain gradient step once, the other
plans it at half its plain peak (default options, plan cache off). Both start
the same way (import jax, build the model), so the ratio of their peak
resident memory, and of their wall times, is what planning adds.

Usage:
    python experiments/planner_memory.py [--layers 12 48 96]

Writes ``experiments/results/planner_memory.csv``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, stamp, write_csv  # noqa: E402

CHILD = """
import sys, jax, remat_opt
from remat_opt.zoo import gpt
mode, layers = sys.argv[1], int(sys.argv[2])
config = gpt.GPTConfig(num_layers=layers, d_model=64, num_heads=4, seq_len=64, batch=4, vocab=128)
params, batch = gpt.init(config, jax.random.key(0))
params = gpt.stack_layers(params)
if mode == "compile":
    jax.jit(jax.value_and_grad(gpt.scan_loss)).lower(params, batch).compile()
else:
    plain = remat_opt.peak_bytes(gpt.scan_loss, params, batch)
    print(remat_opt.optimize(gpt.scan_loss, int(plain * 0.5), cache=False).plan(params, batch))
"""


def measured(mode: str, layers: int) -> tuple[float, int]:
    """Wall seconds and peak resident kilobytes of one child process."""
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", CHILD, mode, str(layers)],
                          check=True, capture_output=True, text=True)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)[1])
    h, m, s = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", done.stderr).groups()
    return int(h or 0) * 3600 + int(m) * 60 + float(s), rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 48, 96])
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        compile_s, compile_kb = measured("compile", layers)
        plan_s, plan_kb = measured("plan", layers)
        rows.append({"layers": layers, "compile_process_seconds": round(compile_s, 1),
                     "compile_process_max_rss_kb": compile_kb, "plan_process_seconds": round(plan_s, 1),
                     "plan_process_max_rss_kb": plan_kb})
        print(f"{layers} layers: plan {plan_s:.0f} s / {plan_kb / 1024:.0f} MiB against one compile "
              f"{compile_s:.0f} s / {compile_kb / 1024:.0f} MiB: {plan_s / compile_s:.1f}x time, "
              f"{plan_kb / compile_kb:.2f}x memory", flush=True)
    write_csv(RESULTS / "planner_memory.csv", rows, f"{stamp()}; {command()}")


if __name__ == "__main__":
    main()
