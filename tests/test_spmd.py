"""Sharded programs: a budget per device, on 8 simulated CPU devices (JAX's SPMD partitioner).

jax has to start with 8 host devices, so the programs run in a process of their own
(``tests/spmd_checks.py``, started once for this module on its cases; the ``shard_map`` cases
run in ``tests/test_spmd_shard_map.py``'s); each test checks what it measured: XLA's per-device
peak against the budget, the gradients against the unsharded ``jax.grad``, the recompute
against the fenced per-layer policies measured the same way, and, for FSDP, the report of each
layer's gathered weights against XLA's count of collective bytes.
"""

import pytest
from spmd_runs import (
    check_gradients_equal_unsharded,
    check_per_device_peak_within_budget,
    check_recompute_at_most_each_fitting_policy,
    run_cases,
)

CASES = ("dp", "fsdp", "dp_tp", "dp_explicit")


@pytest.fixture(scope="module")
def runs() -> dict:
    return run_cases(CASES)


@pytest.mark.parametrize("case", CASES)
def test_per_device_peak_within_budget(runs, case):
    check_per_device_peak_within_budget(runs[case], case)


def test_budget_below_reach_is_refused_per_device(runs):
    run = runs["dp"]
    refusal = run["refusal"]
    assert refusal["error"] == "InfeasibleBudgetError"
    assert run["plain"] // 4 < refusal["min_budget"] <= run["plain"]
    assert "sharded over 8 devices" in refusal["message"] and "one device's peak" in refusal["message"]


@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_unsharded(runs, case):
    check_gradients_equal_unsharded(runs[case])


@pytest.mark.parametrize("case", CASES)
def test_recompute_at_most_each_fitting_policy(runs, case):
    compared = check_recompute_at_most_each_fitting_policy(runs[case])
    if case == "fsdp":
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


def test_a_sharded_plan_is_kept_and_loaded_without_compiling(runs):
    r = runs["fsdp"]["results"][0]
    cached = r["cached"]
    assert cached["valid"] == "ok" and cached["kind"] in ("schedule", "loop", "policy", "plain")
    assert cached["compiles"] == 0  # loaded: no solve, no candidate compiled, no partitioned compile
    assert cached["same"]  # the schedule, XLA's per-device peak and the collectives' report, as made
    assert cached["remeasured"] == cached["measured"] == r["measured"]  # the program rebuilt is the one measured


@pytest.mark.parametrize("case", CASES)
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
