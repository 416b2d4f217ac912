"""The transient of code run as written (memory._transient), judged by XLA: a known gap.

The model charges the step's last segment its largest transient (one cotangent in flight) on
top of every value it stores. On a chain, XLA's peak there is the stored values alone: the
backward runs last position first, so by the time a unit's cotangent is in flight the residuals
downstream of it are dead, and XLA writes the cotangent in place of one. Predicting that (the
transient net of the residuals freed by then, prediction only) put these cases within 0.1% and
raised the held-out generated programs' predictions within 10% from 68% to 82% of 249 budgets,
but the planner then recomputed more at 160 of them (the calibration scale, fitted with the
prediction, is shared with CP-SAT's model, which still charges the whole transient): docs/measurements.md,
"The last segment's transient, netted in the prediction only: tried, dropped (session 51)".
These tests hold the gap until the planning model and the prediction net it together.
"""

import pytest
from known_programs import chain, dot_names

from remat_opt import Schedule
from remat_opt.baselines import BaselineCall, reference
from remat_opt.memory import simulate
from remat_opt.rewrite import apply_schedule

GAP = pytest.mark.xfail(strict=True, reason="known gap: the last segment's transient on top of its stored values")


@pytest.fixture(scope="module")
def wide_last_chain():
    """Three matmuls, each under a sine, the last the widest (512x32 -> 512x64): its
    cotangent is the step's largest transient, and XLA writes it in place of the
    sine's cosine, which the last layer's backward reads for the last time there."""
    program = chain((5, 5, 8), ks=(4, 5, 2))
    return program, reference(BaselineCall(program, program.args(), budget_bytes="1GiB"))


@GAP
@pytest.mark.parametrize("saved_first", [False, True])
def test_the_last_segments_cotangent_takes_a_freed_residuals_buffer(wide_last_chain, saved_first):
    """One fenced segment (the first two layers), the third layer as written, the first
    matmul's output saved by name or not: XLA's peak is the arguments, outputs and stored
    values, nothing in flight beyond them. The model: +7% and +21% of XLA's peak (jax
    0.10.2, XLA:CPU)."""
    program, ref = wide_last_chain
    graph = ref.graph
    first = min(dot_names(graph), key=lambda v: graph.node_unit[v])
    cut = next(u.position for u in graph.units if u.primitive == "sin" and u.position > graph.position_of(first))
    schedule = Schedule(cuts=frozenset({cut + 1}), saved=frozenset({first} if saved_first else ()))
    measured = ref.peak(apply_schedule(program, graph, schedule))
    assert abs(simulate(graph, schedule).peak_bytes / measured - 1) <= 0.01


@GAP
def test_the_plain_chain_needs_no_calibration(wide_last_chain):
    """The plain program's prediction is XLA's peak before calibration scales it; the
    scale is 0.76, standing in for the transient XLA does not hold."""
    _, ref = wide_last_chain
    assert abs(ref.graph.plain_storage_scale - 1) <= 0.02
