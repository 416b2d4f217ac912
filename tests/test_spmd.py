"""Sharded programs: a budget per device, on 8 simulated CPU devices.

jax has to start with 8 host devices, so the programs run in a process of their own
(``tests/spmd_checks.py``, started once for this module); each test checks what it measured:
XLA's per-device peak against the budget, the gradients against the unsharded ``jax.grad``,
the recompute against the fenced per-layer policies measured the same way, and, for FSDP,
the report of each layer's gathered weights against XLA's count of collective bytes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

CHECKS = Path(__file__).with_name("spmd_checks.py")
CASES = ("dp", "fsdp", "dp_tp", "shard_map", "dp_explicit", "shard_map_body", "shard_map_body_explicit")


@pytest.fixture(scope="module")
def runs() -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": os.pathsep.join([str(CHECKS.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(CHECKS), *CASES], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    out = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {run["case"]: run for run in out}


@pytest.mark.parametrize("case", CASES)
def test_per_device_peak_within_budget(runs, case):
    run = runs[case]
    if not case.startswith("shard_map"):  # (a shard_map runs on its mesh whatever its arguments' layout)
        # Measured per device: far under the same program's peak on one device.
        assert run["plain"] < 0.6 * run["global_plain"]
    for r in run["results"]:
        assert r["measured"] <= r["budget"] < run["plain"]
        assert r["remeasured"] == r["measured"]  # the returned function, compiled again
        if r["refused"] is not None:  # a budget below reach named one XLA confirms
            assert r["refused"] < r["budget"]


def test_budget_below_reach_is_refused_per_device(runs):
    run = runs["dp"]
    refusal = run["refusal"]
    assert refusal["error"] == "InfeasibleBudgetError"
    assert run["plain"] // 4 < refusal["min_budget"] <= run["plain"]
    assert "sharded over 8 devices" in refusal["message"] and "one device's peak" in refusal["message"]


@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_unsharded(runs, case):
    for r in runs[case]["results"]:
        assert r["grad_error"] <= 1e-5


@pytest.mark.parametrize("case", CASES)
def test_recompute_at_most_each_fitting_policy(runs, case):
    """Recompute as the planner prices it: FLOPs counted on the jaxpr, and each collective byte
    moved beyond the plain step's at the interconnect's FLOPs per byte (the default's 1,000)."""
    compared = 0
    for r in runs[case]["results"]:
        def cost(flops: int, moved: int) -> float:
            return flops + r["flops_per_byte"] * (moved - r["plain_collective_bytes"])

        ours = cost(r["recompute_flops"], r["collective_bytes"])
        for policy, b in r["baselines"].items():
            if b["peak"] <= r["budget"]:
                compared += 1
                assert ours <= cost(b["flops"], b["collective_bytes"]), (policy, r, b)
    if case in ("fsdp", "shard_map_body", "shard_map_body_explicit"):
        assert compared  # at this budget a per-layer policy fits, so the comparison is not vacuous


def test_fsdp_reports_each_gathered_weight(runs):
    r = runs["fsdp"]["results"][0]
    gathers = r["gathers"]
    weight = 256 * 256 * 4  # one layer's float32 weight, gathered whole on each device
    assert [g["bytes"] for g in gathers] == [weight] * 4
    assert all(g["primitive"] == "sharding_constraint" and g["kinds"] == ["all-gather"] for g in gathers)
    assert {g["decision"] for g in gathers} <= {"saved", "repeated", "held"}
    again = sum(g["bytes"] for g in gathers if g["decision"] == "repeated")
    # XLA's own count of the step's collective bytes covers the gathers the report repeats.
    assert r["collective_bytes"] >= r["plain_collective_bytes"] + again
    assert again == 0 or "gathered again" in r["report"]


def test_shard_map_layers_report_their_all_reduce(runs):
    r = runs["shard_map"]["results"][0]
    # Each layer's psum, one per shard_map unit: recomputing a layer reduces again.
    assert len(r["gathers"]) == 4
    assert all(g["primitive"] == "shard_map" and "all-reduce" in g["kinds"] for g in r["gathers"])
    again = sum(g["bytes"] for g in r["gathers"] if g["decision"] == "repeated")
    assert r["collective_bytes"] >= r["plain_collective_bytes"] + again


def test_a_sharded_plan_is_kept_and_loaded_without_compiling(runs):
    r = runs["fsdp"]["results"][0]
    cached = r["cached"]
    assert cached["valid"] == "ok" and cached["kind"] in ("schedule", "loop", "policy", "plain")
    assert cached["compiles"] == 0  # loaded: no solve, no candidate compiled, no partitioned compile
    assert cached["same"]  # the schedule, XLA's per-device peak and the collectives' report, as made
    assert cached["remeasured"] == cached["measured"] == r["measured"]  # the program rebuilt is the one measured


@pytest.mark.parametrize("case", ["dp", "fsdp", "dp_tp", "dp_explicit"])
def test_a_plan_made_under_jit_is_the_plan_made_on_the_arrays(runs, case):
    """``jax.jit(jax.value_and_grad(step)).lower(*arrays)`` first: the tracers' layout is the arrays'
    (the shardings ``jit`` was passed; on ``Explicit`` axes, the types'), so the plan made there is
    the per-device plan ``plan()`` makes, and ``plan()`` afterwards finds it without compiling."""
    for r in runs[case]["results"]:
        made = r["under_jit"]
        assert made["error"] is None, made["error"]  # not the unsharded program's refusal
        assert made["compiles"] == 0 and made["same"]
        assert made["reordered_layouts_found"]  # under a jit of other arguments too, matched by tracer
        assert made["measured"] == r["measured"] <= r["budget"]
