"""What XLA holds at the peak of a parallel-branches keep-set plan that the model does not.

For a program of ``tests/known_programs.draw_branches`` and each of its keep-set plans
(a fenced segment per branch, some matmul outputs kept), prints the model's peak, XLA's
allocated and live-at-peak bytes, and with ``--buffers`` the buffers live at XLA's peak.

    PYTHONPATH=src python experiments/lab/branch_liveness.py --seeds 3 13 [--buffers]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import jax

# run from experiments/lab/: known_programs is in the repository's tests/, two up
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from known_programs import draw_branches, graph_of, keep_set_schedule  # noqa: E402

import remat_opt  # noqa: E402
from remat_opt.memory import simulate  # noqa: E402
from remat_opt.rewrite import apply_schedule  # noqa: E402


def report(seed: int, buffers: bool) -> None:
    """One line per keep-set of the branches program of ``seed``."""
    program = draw_branches(seed)
    params, x = program.args()
    graph = graph_of(program)
    print(program, "plain peak", remat_opt.peak_bytes(program, params, x))
    n = len(program.dots)
    for kept in itertools.chain.from_iterable(itertools.combinations(range(n), r) for r in range(n + 1)):
        schedule = keep_set_schedule(graph, kept, program.interleaved)
        found = remat_opt.fragmentation(apply_schedule(program, graph, schedule), params, x)
        predicted = simulate(graph, schedule).peak_bytes
        print(f"  kept {kept}: predicted {predicted:,}, XLA allocated {found.allocated_bytes:,} "
              f"({predicted / found.allocated_bytes - 1:+.1%}), live at its peak {found.live_bytes:,} "
              f"({predicted / found.live_bytes - 1:+.1%})")
        if buffers:
            print("    " + ", ".join(f"{name} {size:,}" for name, size in found.buffers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 13])
    parser.add_argument("--buffers", action="store_true")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    for seed in args.seeds:
        report(seed, args.buffers)


if __name__ == "__main__":
    main()
