"""The CP-SAT model against brute force and against the independent simulator."""

import dataclasses
import itertools
import logging

import jax
import jax.numpy as jnp
import pytest

from remat_opt.baselines import BaselineCall, reference
from remat_opt import InfeasibleBudgetError, Schedule
from remat_opt.memory import _simulate
from remat_opt.solve import cut_candidates, save_candidates
from remat_opt.memory import model_graph
from remat_opt.memory._simulate import simulate, simulated
from remat_opt.memory._terms import tail_extra_bytes
from remat_opt.memory._slots import (
    StoredBuffer,
    assign_stored_buffers,
    best_fit_credit,
    gradient_slots,
    segment_slots,
    slot_credit,
    stored_in_slots,
)
from remat_opt.solve._solve import (
    WHOLE_GRAPH_POSITIONS,
    SolverOptions,
    _incumbent,
    _saves_within_cuts,
    min_peak_schedule,
    solve,
)
from remat_opt.program import trace
from remat_opt.zoo import GPTConfig, gpt


def tiny_chain(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x**2)


def tiny_skip(ws, x):
    h1 = jnp.tanh(x @ ws[0])
    h2 = jnp.sin(h1 @ ws[1])
    return jnp.sum((h2 + h1) ** 2)


def tiny_transpose(ws, x):
    h = jnp.tanh(x @ ws[0]).T + 1.0  # laid out transposed: a relayout copy when it crosses
    h2 = jnp.tanh(ws[1] @ h)
    return jnp.sum((h2 * h) ** 2)


def tiny_softmax(ws, x):
    e = jnp.exp(x @ ws[0])  # 8 cut and 8 save candidates: 2**16 schedules to brute-force
    p = e / jnp.sum(e, axis=1, keepdims=True)  # a quotient by a broadcast row sum (_transient.transient_bytes)
    return jnp.sum(jnp.sin(p @ ws[1]) ** 2)


def tiny_output(ws, x):
    s = x @ ws[0] + 1.0  # recomputing cos(s) reads s; past its segment only the last segment's add does
    b = jnp.tanh(jnp.sin(s) @ ws[1])
    return jnp.sum((b + s) ** 2)


def tiny_recurrent(ws, x):
    for _ in range(3):  # one weight read at three positions: XLA may sum its partials at the end
        x = jnp.tanh(x @ ws[0])
    return jnp.sum(x**2)


PROGRAMS = {
    "chain": (tiny_chain, [jnp.full((8, 8), 0.1) for _ in range(3)], jnp.ones((16, 8))),
    "skip": (tiny_skip, [jnp.full((8, 8), 0.1) for _ in range(2)], jnp.ones((16, 8))),
    "transpose": (tiny_transpose, [jnp.full((8, 8), 0.1) for _ in range(2)], jnp.ones((16, 8))),
    "output": (tiny_output, [jnp.full((8, 8), 0.1) for _ in range(2)], jnp.ones((16, 8))),
    "softmax": (tiny_softmax, [jnp.full((8, 8), 0.1) for _ in range(2)], jnp.ones((16, 8))),
    # Activations as large as a weight: stored values fit in gradient slots (_slots.slot_credit).
    "chain_slots": (tiny_chain, [jnp.full((16, 16), 0.1) for _ in range(3)], jnp.ones((16, 16))),
    # A weight whose gradient's partials are held to one sum at the end (memory._partials).
    "recurrent": (tiny_recurrent, [jnp.full((8, 8), 0.1)], jnp.ones((16, 8))),
}


def _graph(fn, *args):
    graph = model_graph(trace(fn, args, {}, (0,)))
    if fn is tiny_recurrent:  # as XLA:CPU compiles it (deferred_sums): the shared weight's partials
        graph = dataclasses.replace(graph, summed_at_end=tuple(len(r) >= 3 for r in graph.input_readers))
    return graph


def _all_schedules(graph):
    cuts, saves = cut_candidates(graph, 64), save_candidates(graph)
    for k in range(len(cuts) + 1):
        for cut_set in itertools.combinations(cuts, k):
            for j in range(len(saves) + 1):
                for saved in itertools.combinations(saves, j):
                    yield Schedule(frozenset(cut_set), frozenset(saved))


@pytest.mark.parametrize("scale", [1.0, 1.3])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_solver_optimum_equals_brute_force(name, scale):
    fn, ws, x = PROGRAMS[name]
    _check_against_brute_force(dataclasses.replace(_graph(fn, ws, x), plain_storage_scale=scale))  # as calibrated


def test_solver_counts_a_transposes_forward_scratch_behind_fences():
    # A transpose whose part that reads forward values only holds scratch (max
    # pooling's index search, memory._scratch): behind a fence it is held in
    # the backward, in the last segment not. CP-SAT must charge it as the
    # planning model does, for units it stores as well as for those it recomputes.
    fn, ws, x = PROGRAMS["chain_slots"]
    graph = dataclasses.replace(_graph(fn, ws, x), plain_storage_scale=1.3)  # cuts pay off
    first = {}
    for u in graph.units:
        first.setdefault(u.position, u.index)
    scratch = [(0, 0, 0)] * len(graph.units)
    scratch[first[2]] = (0, 2 * max(graph.node_bytes), 0)  # the second matmul's transpose
    _check_against_brute_force(dataclasses.replace(graph, scratch=tuple(scratch)))


def _check_against_brute_force(graph):
    assert graph.num_positions <= 12
    sims = [simulate(graph, s, planning=True) for s in _all_schedules(graph)]
    peaks = sorted({s.peak_bytes for s in sims})
    assert len(peaks) > 2, "the search space should offer several trade-offs"
    for budget in peaks[:: max(1, len(peaks) // 6)] + [peaks[-1]]:
        best = min(s.recompute_flops for s in sims if s.peak_bytes <= budget)
        solution = solve(graph, budget)
        checked = simulate(graph, solution.schedule, planning=True)
        assert solution.status == "OPTIMAL"
        assert checked.peak_bytes <= budget
        assert simulate(graph, solution.schedule).peak_bytes <= checked.peak_bytes  # the prediction
        assert checked.recompute_flops == solution.objective_flops == best


@pytest.mark.parametrize("name", ["chain", "softmax", "chain_slots"])
def test_first_stage_is_the_best_saving_within_its_cuts(name):
    """solve's first stage: the cheapest schedule whose cuts are among the start's,
    never worse than the start, and the budget holds (brute force over those)."""
    fn, ws, x = PROGRAMS[name]
    graph = _graph(fn, ws, x)
    start = Schedule(frozenset(cut_candidates(graph, 64)[1::2]))
    within = [s for s in _all_schedules(graph) if s.cuts <= start.cuts]
    sims = {s: simulate(graph, s, planning=True) for s in within}
    budgets = sorted({sim.peak_bytes for sim in sims.values() if sim.peak_bytes >= sims[start].peak_bytes})
    assert len(budgets) > 1
    for budget in budgets:
        found = _saves_within_cuts(graph, budget, start, SolverOptions())
        best = min(sim.recompute_flops for sim in sims.values() if sim.peak_bytes <= budget)
        assert found.cuts <= start.cuts
        assert simulate(graph, found, planning=True).peak_bytes <= budget
        assert simulate(graph, found).recompute_flops == best <= sims[start].recompute_flops


def test_first_stage_is_optional_and_its_share_is_checked():
    fn, ws, x = PROGRAMS["chain"]
    graph = _graph(fn, ws, x)
    budget = simulate(graph, min_peak_schedule(graph)).peak_bytes + 4096
    two_stages = solve(graph, budget, SolverOptions(first_stage_share=0.4))
    assert two_stages.objective_flops == solve(graph, budget).objective_flops  # both optimal on a tiny graph
    with pytest.raises(ValueError, match="first_stage_share"):
        SolverOptions(first_stage_share=1.0)


@pytest.mark.parametrize("name", ["chain", "chain_slots", "recurrent"])
def test_min_peak_equals_brute_force(name):
    fn, ws, x = PROGRAMS[name]
    graph = _graph(fn, ws, x)
    lowest = min(simulate(graph, s, planning=True).peak_bytes for s in _all_schedules(graph))
    assert simulate(graph, min_peak_schedule(graph), planning=True).peak_bytes == lowest


def test_infeasible_budget_reports_reachable_minimum():
    fn, ws, x = PROGRAMS["chain"]
    graph = _graph(fn, ws, x)
    lowest = simulate(graph, min_peak_schedule(graph), planning=True).peak_bytes
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, lowest - 1)
    assert info.value.min_budget_bytes == lowest
    assert "budget_bytes" in str(info.value)


def test_solve_is_deterministic():
    fn, ws, x = PROGRAMS["skip"]
    graph = _graph(fn, ws, x)
    budget = simulate(graph, min_peak_schedule(graph)).peak_bytes + 512
    options = SolverOptions(num_workers=4, seed=3)
    first, second = solve(graph, budget, options), solve(graph, budget, options)
    assert first.schedule == second.schedule


def test_slot_credit_matches_nested_slots():
    """Each buffer takes a slot of its size freed before it is computed; one a slot."""
    slots = ((1024, 3), (1024, 7), (512, 1))
    assert slot_credit([(1024, 5)], slots) == 1024
    assert slot_credit([(1024, 5), (1024, 6)], slots) == 1024  # one slot free before position 5
    assert slot_credit([(1024, 5), (1024, 9)], slots) == 2048
    assert slot_credit([(1024, 2), (512, 4), (2048, 9)], slots) == 512  # too early; fits; no slot that size


def test_stored_buffers_take_the_smallest_slot_they_fit_once():
    """XLA's order: largest buffer first, then program order; each into the
    smallest slot at least as large, free before it is computed and written
    only after the buffer's last backward reader; one buffer a slot."""
    slots = ((512, 1), (1024, 3), (4096, 2))
    segments = [0, 1, 0]  # the segment of each slot's last reader
    take = lambda *items: assign_stored_buffers([StoredBuffer(*i) for i in items], slots, segments)  # noqa: E731
    assert take((7, 512, 5, 2)) == {0: 7}  # its own size
    assert take((7, 512, 5, 2), (8, 512, 6, 2)) == {0: 7, 1: 8}  # then a larger one
    assert take((7, 1024, 5, 1)) == {2: 7}  # read last in segment 1: not the slot written there
    assert take((7, 1024, 5, 2), (8, 4096, 9, 3)) == {1: 7, 2: 8}
    assert take((7, 2048, 5, 2), (8, 512, 1, 2)) == {2: 7}  # 8 is computed before any slot is free
    assert take((8, 512, 6, 2), (7, 512, 5, 2), (9, 512, 7, 2)) == {0: 7, 1: 8, 2: 9}  # program order


def test_saved_names_take_slots_from_code_run_as_written():
    """The prediction lays a saved name over a slot though its own segment's
    backward reads it (a boundary value only when a later segment does), and
    code run as written then keeps no slot from the plain program's calibration."""
    fn, ws, x = PROGRAMS["chain_slots"]
    graph = _graph(fn, ws, x)
    v = next(v for v in range(graph.num_nodes) if graph.buffer[v] == v and graph.node_bytes[v] == 1024)
    node_seg = [1] * graph.num_nodes
    copies = [(v, 0, 1, 1)]  # stored from its own segment, read first there
    assert stored_in_slots(graph, copies, node_seg, set(), frozenset()) == []
    assert stored_in_slots(graph, copies, node_seg, set(), frozenset({v})) == [
        StoredBuffer(v, 1024, graph.position_of(v), 1)]
    assert stored_in_slots(graph, copies, node_seg, {v}, frozenset({v})) == []  # stored by a nested level
    below, above = (dataclasses.replace(graph, plain_storage_scale=s) for s in (0.9, 1.2))
    assert tail_extra_bytes(below, v) < 0 and tail_extra_bytes(below, v, names_in_slots=True) == 0
    assert tail_extra_bytes(above, v) == tail_extra_bytes(above, v, names_in_slots=True) > 0


def test_best_fit_credit_lays_the_largest_first():
    free = ((512, 0), (2048, 0))  # (bytes, position of the input's last reader)
    assert best_fit_credit([(5, 512), (5, 2048)], free) == 2560  # (position, bytes)
    assert best_fit_credit([(5, 1024), (5, 1024)], free) == 1024  # one a slot; 512 is too small
    assert best_fit_credit([(5, 4096)], free) == 0
    assert best_fit_credit([], free) == 0


def test_best_fit_credit_only_in_slots_read_before_the_buffer():
    free = ((1024, 10), (1024, 20))
    assert best_fit_credit([(15, 1024), (25, 1024)], free) == 2048
    # Buffers computed before a slot's last read: only the slot read at 10 fits them, and once.
    assert best_fit_credit([(15, 1024), (15, 1024)], free) == 1024
    assert best_fit_credit([(5, 1024)], free) == 0
    # A slot read late is left to the buffer that needs it: 25 takes slot 20, 15 takes slot 10.
    assert best_fit_credit([(25, 1024), (15, 512)], free) == 1536


def test_stored_values_fill_free_gradient_slots(monkeypatch):
    """A stored activation as large as a weight is credited when a slot of an
    earlier weight is free, at most once per stored buffer; what a fenced
    segment recomputes also takes the slots of matmul weights read before it
    inside the segment, one a slot."""
    fn, ws, x = PROGRAMS["chain_slots"]
    graph = _graph(fn, ws, x)
    assert [size for size, _ in gradient_slots(graph)] == [1024, 1024, 1024]
    without = dataclasses.replace(graph, input_readers=tuple(() for _ in graph.input_readers))  # no slots

    def credits():
        schedules = [Schedule(frozenset({cut})) for cut in cut_candidates(graph, 64)]
        # Afresh (simulated, not the kept simulations): a rule is patched below.
        return [simulated(without, s).peak_bytes - simulated(graph, s).peak_bytes for s in schedules]

    assert max(credits()) == 3 * 1024 and min(credits()) == 0  # the three weights' slots, each once
    # A convolution's kernel gradient holds its transposed kernel: only slots read before the segment.
    monkeypatch.setattr(_simulate, "matmul_slots", lambda graph: (False,) * len(gradient_slots(graph)))
    assert max(credits()) == 1024 and min(credits()) == 0


def test_schedules_that_save_names_free_a_slot_from_the_next_segment():
    """Each slot's position moves to the end of its reader's segment, in the
    prediction; the planning model (CP-SAT's) credits no slot there."""
    slots = ((1024, 3), (1024, 7), (512, 1))
    moved = segment_slots(slots, {5, 9}, 12)
    assert moved == ((1024, 4), (1024, 8), (512, 4))  # in the same order
    assert slot_credit([(1024, 4)], slots) == 1024 and slot_credit([(1024, 4)], moved) == 0  # same segment
    assert slot_credit([(1024, 5)], moved) == 1024  # the next segment
    assert segment_slots(slots, set(), 12) == ((1024, 11), (1024, 11), (512, 11))  # one segment: none free
    fn, ws, x = PROGRAMS["chain_slots"]
    graph = _graph(fn, ws, x)
    without = dataclasses.replace(graph, input_readers=tuple(() for _ in graph.input_readers))  # no slots
    credit = lambda s: simulate(without, s).peak_bytes - simulate(graph, s).peak_bytes  # noqa: E731
    named = [s for s in _all_schedules(graph) if s.saved and s.cuts][::8]  # 1 in 8 of 2**14: seconds, not 22
    assert max(credit(s) for s in named) > 0 and min(credit(s) for s in named) == 0
    assert all(simulate(without, s, planning=True).peak_bytes == simulate(graph, s, planning=True).peak_bytes
               for s in named)  # the planning model credits none


def test_a_search_the_wall_clock_stops_is_reported(small_gpt, caplog):
    # The deterministic limit makes a time-out repeatable; when the wall-clock
    # cap stops CP-SAT first, the plan may change from run to run: the log says so.
    loss, params, batch = small_gpt
    ref = reference(BaselineCall(loss, (params, batch), budget_bytes=1 << 40))
    budget = int(0.6 * ref.plain_peak_bytes)
    with caplog.at_level(logging.WARNING, logger="remat_opt"):
        solve(ref.graph, budget, SolverOptions(deterministic_time_limit=0.05, whole_graph=True))
    assert "wall-clock" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="remat_opt"):
        solution = solve(ref.graph, budget, SolverOptions(time_limit_s=0.05, deterministic_time_limit=60.0,
                                                          whole_graph=True))
    assert solution.status != "OPTIMAL"
    assert "wall-clock cap" in caplog.text


def test_a_large_program_of_blocks_takes_the_decomposition_by_default():
    """Above WHOLE_GRAPH_POSITIONS, a program of repeated layers gets the block
    decomposition's plan without the whole-graph CP-SAT (which did not improve
    it there); asked for, the whole-graph search runs from it and is no worse."""
    config = GPTConfig(num_layers=4, d_model=64, num_heads=2, seq_len=64, batch=2, vocab=64)
    params, batch = gpt.init(config, jax.random.PRNGKey(0))
    loss = gpt.loss
    ref = reference(BaselineCall(loss, (params, batch), budget_bytes=1 << 40))
    assert ref.graph.num_positions > WHOLE_GRAPH_POSITIONS
    budget = int(0.6 * ref.plain_peak_bytes)
    default = solve(ref.graph, budget)
    assert default.method == "blocks"
    whole = solve(ref.graph, budget, SolverOptions(whole_graph=True, deterministic_time_limit=1.0))
    assert whole.method == "blocks+cp-sat" and whole.objective_flops <= default.objective_flops


def test_a_start_that_fits_is_where_the_search_starts():
    """solve's ``starts``: the cheapest that CP-SAT's own model fits joins Chen's
    segmentations as the incumbent; one it puts over the budget does not."""
    fn, ws, x = PROGRAMS["chain_slots"]
    graph = dataclasses.replace(_graph(fn, ws, x), plain_storage_scale=1.3)  # cuts pay off
    sims = {s: simulate(graph, s, planning=True) for s in _all_schedules(graph)}

    def flops(schedule):
        return simulate(graph, schedule).recompute_flops

    def key(schedule):
        return sims[schedule].recompute_flops, sorted(schedule.cuts), sorted(schedule.saved)

    worth = []  # budgets where the cheapest schedule is cheaper than every Chen start that fits
    for budget in sorted({sim.peak_bytes for sim in sims.values()}):
        cheapest = min((s for s, sim in sims.items() if sim.peak_bytes <= budget), key=key)
        chen = _incumbent(graph, budget)
        if chen is None or sims[cheapest].recompute_flops < flops(chen):
            worth.append((budget, cheapest, chen))
    assert worth, "some budget should have a start cheaper than Chen's"
    for budget, cheapest, chen in worth:
        over = min((s for s, sim in sims.items() if sim.peak_bytes > budget), key=key)
        costlier = max((s for s, sim in sims.items() if sim.peak_bytes <= budget), key=key)
        assert _incumbent(graph, budget, (costlier, over, cheapest)) == cheapest
        assert _incumbent(graph, budget, (over,)) == chen
        found = solve(graph, budget, SolverOptions(), (cheapest,))
        assert found.objective_flops <= sims[cheapest].recompute_flops
