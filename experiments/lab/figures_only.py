"""Figures-only compiles against default ones: the same peak, in less time.

``optimize`` compiles its candidates with LLVM's optimization off
(:data:`remat_opt.memory._compiles.FIGURES_ONLY`) and only the plan it returns
as the user's ``jax.jit`` compiles it. That rests on XLA's memory figures not
depending on the option. This script checks it on every development and
held-out program (and the scanned library programs), each as written and
under two whole-function policies, and times both compiles.

Usage:
    python experiments/lab/figures_only.py [--output figures_only.csv]

Writes ``experiments/results/<output>``; exits 1 if any figure differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax

from remat_opt.memory._compiles import FIGURES_ONLY
from remat_opt.memory import abstract, gradient_step, memory_of
from remat_opt.rewrite import policy_program

# run from experiments/lab/: common and the *_programs sets are in experiments/, one up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import RESULTS, command, stamp, write_csv  # noqa: E402
import dev_programs  # noqa: E402
import heldout_programs  # noqa: E402
import heldout_scan_programs  # noqa: E402

VARIANTS = ("as written", "nothing_saveable", "dots_saveable")


def programs() -> Iterator[tuple[str, Callable[[], heldout_programs.Program]]]:
    yield from heldout_programs.PROGRAMS.items()
    yield from dev_programs.DEV_PROGRAMS.items()
    yield "flax_linen_scan", heldout_scan_programs.flax_linen_scan
    yield "equinox_scan", heldout_scan_programs.equinox_scan


def timed_peak(lowered, options: dict | None) -> tuple[int, float]:
    start = time.perf_counter()
    peak = memory_of(lowered.compile(compiler_options=options))
    return peak, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="figures_only.csv")
    args = parser.parse_args()
    rows = []
    for name, make in programs():
        try:
            program = make()
        except ImportError as err:  # a library program whose library is missing
            print(f"{name}: skipped ({err})", flush=True)
            continue
        for variant in VARIANTS:
            fn = program.loss if variant == "as written" else policy_program(program.loss, variant)
            step, step_args, _ = gradient_step(fn, program.args, {}, program.argnums, False)
            lowered = jax.jit(step).lower(*abstract(step_args))
            default, default_s = timed_peak(lowered, None)
            fast, fast_s = timed_peak(lowered, FIGURES_ONLY)
            rows.append({"program": name, "variant": variant, "default_peak_bytes": default,
                         "figures_only_peak_bytes": fast, "same": default == fast,
                         "default_compile_s": round(default_s, 2), "figures_only_compile_s": round(fast_s, 2)})
            print(f"{name:22s} {variant:17s} {default:>11,} {fast:>11,} {'same' if default == fast else 'DIFFERS'} "
                  f"{default_s:6.2f}s {fast_s:6.2f}s", flush=True)
    write_csv(RESULTS / args.output, rows, f"{stamp()}; {command()}")
    same = sum(r["same"] for r in rows)
    ratio = sum(r["figures_only_compile_s"] for r in rows) / sum(r["default_compile_s"] for r in rows)
    print(f"{same} of {len(rows)} figures the same; figures-only compiles take {ratio:.2f}x the time")
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
