"""Sharded programs written per device with ``shard_map``, on 8 simulated CPU devices.

The ``shard_map`` cases of ``tests/spmd_checks.py``, run in a process of their own (jax has to
start with 8 host devices), started once for this module; ``tests/test_spmd.py`` runs the cases
JAX's SPMD partitioner shards, in another, so that the two run side by side. Each test checks
what was measured: XLA's per-device peak against the budget, the gradients against the
unsharded ``jax.grad``, the recompute against the fenced per-layer policies measured the same
way, and each layer's all-reduce in the report.
"""

import pytest
from spmd_runs import (
    check_gradients_equal_unsharded,
    check_per_device_peak_within_budget,
    check_recompute_at_most_each_fitting_policy,
    run_cases,
)

CASES = ("shard_map", "shard_map_body", "shard_map_body_explicit")


@pytest.fixture(scope="module")
def runs() -> dict:
    return run_cases(CASES)


@pytest.mark.parametrize("case", CASES)
def test_per_device_peak_within_budget(runs, case):
    check_per_device_peak_within_budget(runs[case], case)


@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_unsharded(runs, case):
    check_gradients_equal_unsharded(runs[case])


@pytest.mark.parametrize("case", CASES)
def test_recompute_at_most_each_fitting_policy(runs, case):
    compared = check_recompute_at_most_each_fitting_policy(runs[case])
    if case in ("shard_map_body", "shard_map_body_explicit"):
        assert compared  # at this budget a per-layer policy fits, so the comparison is not vacuous


def test_shard_map_layers_report_their_all_reduce(runs):
    r = runs["shard_map"]["results"][0]
    # Each layer's psum, one per shard_map unit: recomputing a layer reduces again.
    assert len(r["gathers"]) == 4
    assert all(g["primitive"] == "shard_map" and "all-reduce" in g["kinds"] for g in r["gathers"])
    again = sum(g["bytes"] for g in r["gathers"] if g["decision"] == "repeated")
    assert r["collective_bytes"] >= r["plain_collective_bytes"] + again
