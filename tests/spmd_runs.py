"""What ``tests/test_spmd.py`` and ``tests/test_spmd_shard_map.py`` share: ``tests/spmd_checks.py``
run in a process of its own (jax has to start with 8 host devices) on some of its cases, and the
checks every case gets.

The cases are split between two test files so that pytest-xdist (``--dist loadfile``) can run
the two processes on its two workers at once.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

CHECKS = Path(__file__).with_name("spmd_checks.py")


def run_cases(cases: tuple[str, ...]) -> dict:
    """``spmd_checks.py`` on ``cases``: per case, the JSON object it prints."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": os.pathsep.join([str(CHECKS.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(CHECKS), *cases], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    out = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    runs = {run["case"]: run for run in out}
    assert set(runs) == set(cases), sorted(runs)
    return runs


def check_per_device_peak_within_budget(run: dict, case: str) -> None:
    if not case.startswith("shard_map"):  # (a shard_map runs on its mesh whatever its arguments' layout)
        # Measured per device: far under the same program's peak on one device.
        assert run["plain"] < 0.6 * run["global_plain"]
    for r in run["results"]:
        assert r["measured"] <= r["budget"] < run["plain"]
        assert r["remeasured"] == r["measured"]  # the returned function, compiled again
        if r["refused"] is not None:  # a budget below reach named one XLA confirms
            assert r["refused"] < r["budget"]


def check_gradients_equal_unsharded(run: dict) -> None:
    for r in run["results"]:
        assert r["grad_error"] <= 1e-5


def check_recompute_at_most_each_fitting_policy(run: dict) -> int:
    """Recompute as the planner prices it: FLOPs counted on the jaxpr, and each collective byte
    moved beyond the plain step's at the interconnect's FLOPs per byte (the default's 1,000).
    Returns how many fitting policies were compared."""
    compared = 0
    for r in run["results"]:
        def cost(flops: int, moved: int) -> float:
            return flops + r["flops_per_byte"] * (moved - r["plain_collective_bytes"])

        ours = cost(r["recompute_flops"], r["collective_bytes"])
        for policy, b in r["baselines"].items():
            if b["peak"] <= r["budget"]:
                compared += 1
                assert ours <= cost(b["flops"], b["collective_bytes"]), (policy, r, b)
    return compared
