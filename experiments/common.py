"""What every experiment script shares: the stamp, the CSV writer, the step timer.

Every figure of the paper is stamped with the jax version and the machine it
was measured on, and every script prints the one command that regenerates it.
"""

from __future__ import annotations

import atexit
import csv
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

MiB = 2**20


def mib(n: int | None) -> str:
    """``n`` bytes in MiB with two decimals; ``-`` for no figure (a plan the model does not predict)."""
    return "-" if n is None else f"{n / MiB:.2f}"


RESULTS = Path(__file__).resolve().parent / "results"

# Experiments plan afresh: a plan loaded from the user's plan cache would time
# nothing and could come from other options. One empty cache folder per run
# (the test suite sets its own, which the scripts it starts keep).
if "REMAT_OPT_CACHE_DIR" not in os.environ:
    os.environ["REMAT_OPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="remat_opt_experiment_cache_")
    atexit.register(shutil.rmtree, os.environ["REMAT_OPT_CACHE_DIR"], True)


def machine() -> str:
    """The host: platform, processor and JAX backend."""
    processor = platform.processor() or platform.machine()
    return f"{platform.platform()}; {processor}; jax backend {jax.default_backend()}"


def stamp() -> str:
    """One line for every table and figure: jax version and machine."""
    return f"jax {jax.__version__}, jaxlib {jax.lib.__version__}; {machine()}"


def command() -> str:
    """The command line that reproduces this run."""
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def write_csv(path: Path, rows: Sequence[dict], comment: str) -> None:
    """Writes ``rows`` with a leading ``# comment`` line (the stamp and command)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as f:
        for line in comment.splitlines():
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv` (comment lines skipped)."""
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def grad_error_over_tolerance(got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-6) -> float:
    """Largest ``|got - want| / (atol + rtol |want|)`` over the leaves: at most 1 is ``np.allclose``."""
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / (atol + rtol * np.abs(np.asarray(b)))))
               for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def step_seconds(fn: Callable[..., Any], args: tuple, repeats: int = 5) -> float:
    """Median wall time of one jitted gradient step of ``fn`` (after compiling)."""
    step = jax.jit(jax.value_and_grad(fn))
    jax.block_until_ready(step(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)
