"""Loop plans: the model's predicted peak against XLA's, plan by plan.

On the zoo GPT written with ``lax.scan`` over stacked layers
(:func:`remat_opt.zoo.gpt.scan_loss`), every loop plan ``optimize`` measures
(:mod:`remat_opt.rewrite._loops`: a built-in policy on the body, the iterations in
checkpointed groups, or both) is predicted by the memory model, as
``optimize`` predicts it (storage scale calibrated on the scan as written),
and measured on XLA; beside it, what the model said before it charged a
rematerializing body's rerun (:mod:`remat_opt.memory._inner`).

Usage:
    python experiments/loop_fidelity.py [--layers 12] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import jax

import remat_opt
from remat_opt.memory import model_graph
from remat_opt.rewrite import loop_candidates, loop_program, scan_lengths
from remat_opt.memory import abstract
from remat_opt.memory import calibrate
from remat_opt.memory import simulate
from remat_opt.program._trace import with_signature
from remat_opt._schedule import Schedule
from remat_opt.program import trace
from remat_opt.zoo import gpt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, stamp, write_csv  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="a 4-layer toy GPT")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    header = f"{stamp()}\nreproduce: {command()}"
    print(header, flush=True)

    if args.quick:
        config = gpt.GPTConfig(num_layers=4, d_model=32, seq_len=32, batch=2, vocab=64)
    else:
        config = gpt.GPTConfig(num_layers=args.layers)
    params, batch = gpt.init(config, jax.random.PRNGKey(0))
    inputs = abstract((gpt.stack_layers(params), batch))
    whole = trace(gpt.scan_loss, inputs, {}, (0,))
    plain = remat_opt.peak_bytes(gpt.scan_loss, *inputs)
    scale = calibrate(model_graph(whole), plain).plain_storage_scale
    print(f"{config}\nscan as written: {plain / MiB:.2f} MiB (storage scale {scale:.3f})", flush=True)

    rows = []
    for plan in loop_candidates(scan_lengths(whole)):
        program = with_signature(gpt.scan_loss, whole, loop_program(whole, plan))
        graph = dataclasses.replace(model_graph(trace(program, inputs, {}, (0,))), plain_storage_scale=scale)
        predicted = simulate(graph, Schedule(plain=True)).peak_bytes
        without = simulate(dataclasses.replace(graph, inner_bytes=()), Schedule(plain=True)).peak_bytes
        measured = remat_opt.peak_bytes(program, *inputs)
        rows.append({"plan": str(plan), "predicted_peak_bytes": predicted, "measured_peak_bytes": measured,
                     "error": (predicted - measured) / measured,
                     "predicted_without_rerun_bytes": without, "error_without_rerun": (without - measured) / measured})
        print(f"  {str(plan):82s} predicted {predicted / MiB:7.2f}  measured {measured / MiB:7.2f}  "
              f"{rows[-1]['error']:+6.1%}  (without the rerun: {rows[-1]['error_without_rerun']:+6.1%})", flush=True)
    write_csv(args.out / "loop_fidelity.csv", rows, header)
    within = sum(abs(r["error"]) <= 0.10 for r in rows)
    print(f"\n{within} of {len(rows)} loop plans within 10%; errors {min(r['error'] for r in rows):+.1%} .. "
          f"{max(r['error'] for r in rows):+.1%} (without the rerun: "
          f"{min(r['error_without_rerun'] for r in rows):+.1%} .. {max(r['error_without_rerun'] for r in rows):+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
