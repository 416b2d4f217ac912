"""Identical blocks: found in the program, combined exactly, planned end to end."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiment_scripts import read_rows, run_script

import remat_opt
from remat_opt import Schedule
from remat_opt.memory import model_graph, peak_bytes
from remat_opt.memory import simulate
from remat_opt.program import trace
from remat_opt.solve import _block_solve
from remat_opt.solve._block_solve import CAP_STEPS, ChainSearch, chain_schedule
from remat_opt.solve import find_blocks
from remat_opt.solve import SolverOptions, solve
from remat_opt.zoo import MODELS, GPTConfig


def residual_chain(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w) + x
    return jnp.sum(x**2)


def widening_chain(ws, x):  # every layer has other shapes: nothing repeats
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x**2)


def _graph(fn, *args):
    return model_graph(trace(fn, args, {}, (0,)))


def _chain_args(layers, width=32, rows=128):
    ws = [jax.random.normal(jax.random.PRNGKey(i), (width, width)) / width for i in range(layers)]
    return ws, jax.random.normal(jax.random.PRNGKey(99), (rows, width))


def test_finds_the_repeated_layer():
    graph = _graph(residual_chain, *_chain_args(6))
    chain = find_blocks(graph)
    # Three positions per layer (dot, tanh, add); the first layer reads the argument and
    # the last one feeds the loss, so the blocks are the layers between.
    assert chain is not None and chain.length == 3 and chain.count >= 3
    assert chain.unit_step == len([u for u in graph.units if chain.start <= u.position < chain.boundary(1)])
    one_stream = graph.crossing_bytes(chain.start)
    assert all(graph.crossing_bytes(chain.boundary(k)) == one_stream for k in range(chain.count + 1))


def test_finds_the_zoo_gpt_layer():
    spec = MODELS["gpt"]
    sizes = {}
    for layers in (3, 4):
        config = GPTConfig(num_layers=layers, d_model=32, num_heads=2, seq_len=16, batch=1, vocab=32)
        params, batch = spec.init(config, jax.random.PRNGKey(0))
        graph = _graph(spec.loss, params, batch)
        sizes[layers] = (graph.num_positions, find_blocks(graph))
    per_layer = sizes[4][0] - sizes[3][0]
    assert sizes[3][1].length == sizes[4][1].length == per_layer
    assert sizes[4][1].count == sizes[3][1].count + 1


def test_no_blocks_without_repetition_and_solve_unchanged():
    ws = [jax.random.normal(jax.random.PRNGKey(i), (8 * (i + 2), 8 * (i + 3))) / 16 for i in range(5)]
    graph = _graph(widening_chain, ws, jnp.ones((64, 16)))
    assert find_blocks(graph) is None
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    options = SolverOptions(time_limit_s=30, deterministic_time_limit=2, num_workers=2)
    on = solve(graph, int(0.95 * plain), options)
    off = solve(graph, int(0.95 * plain), SolverOptions(time_limit_s=30, deterministic_time_limit=2, num_workers=2,
                                                          blocks=False))
    assert on.method == off.method == "cp-sat"
    assert on.schedule == off.schedule


def _two_levels(search: ChainSearch) -> None:
    """Each stage's options cut to two: nothing, or what it saves under the middle cap."""
    half = CAP_STEPS // 2
    search.options = {key: (lv[0],) + (lv[half],) * CAP_STEPS for key, lv in search.options.items()}
    search._step_memo.clear()
    search._term_memo.clear()


def _brute_force(graph, search: ChainSearch, budget: int) -> int | None:
    """The least recompute, judged by the simulator, of every plan in the block plan space."""
    costs, levels = search.costs, (0, 1)
    best = None if simulate(graph, Schedule(), planning=True).peak_bytes > budget else 0

    def plans(t, u):  # segmentations of stages t .. u - 1 with one level each
        if t == u:
            yield (), frozenset()
            return
        for end in range(t + 1, u + 1):
            for level in levels:
                saved = frozenset().union(*search._saved_of(t, end, level).values())
                for cuts, rest in plans(end, u):
                    yield (costs.bounds[end], *cuts), saved | rest

    for tail in range(1, costs.num_stages):
        for cuts, saved in plans(0, tail):
            sim = simulate(graph, Schedule(cuts=frozenset(cuts), saved=saved), planning=True)
            if sim.peak_bytes <= budget and (best is None or sim.recompute_flops < best):
                best = sim.recompute_flops
    return best


def test_chain_dynamic_program_is_optimal_in_its_plan_space():
    graph = _graph(residual_chain, *_chain_args(4))  # activations larger than any gradient slot
    chain = find_blocks(graph)
    search = ChainSearch(graph, chain, max_stages=64)
    _two_levels(search)
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    lowest = min(search.costs.tail_bytes) + graph.input_bytes + graph.output_bytes
    found = []
    for share in (0.55, 0.7, 0.85, 0.95):
        budget = int(lowest + share * (plain - lowest))
        plan = chain_schedule(graph, chain, budget, search, grain=1)
        expected = _brute_force(graph, search, budget)
        assert (plan is None) == (expected is None)
        if plan is not None:
            sim = simulate(graph, plan.schedule, planning=True)
            assert plan.flops == sim.recompute_flops == expected
            assert plan.peak_bytes == sim.peak_bytes <= budget
            found.append(plan.flops)
    assert len(set(found)) >= 2  # the budgets reach different plans


def test_block_plans_are_counted_as_the_simulator_counts_them():
    spec = MODELS["gpt"]
    config = GPTConfig(num_layers=4, d_model=32, num_heads=2, seq_len=16, batch=1, vocab=32)
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    graph = _graph(spec.loss, params, batch)
    chain = find_blocks(graph)
    search = ChainSearch(graph, chain)
    plain = simulate(graph, Schedule(plain=True)).peak_bytes
    for share in (0.75, 0.85, 0.95):
        plan = chain_schedule(graph, chain, int(share * plain), search)
        sim = simulate(graph, plan.schedule, planning=True)
        assert plan.flops == sim.recompute_flops
        assert plan.peak_bytes >= sim.peak_bytes  # equal with names; no gradient-slot credit counted
        if plan.schedule.saved:
            assert plan.peak_bytes == sim.peak_bytes


def test_optimize_plans_a_deep_chain_through_its_blocks(monkeypatch):
    ws, x = _chain_args(8, width=64, rows=512)
    plain = peak_bytes(residual_chain, ws, x)
    starts = []
    block_start = _block_solve.block_start
    monkeypatch.setattr("remat_opt.solve._solve.block_start",
                        lambda *a: starts.append(block_start(*a)) or starts[-1])
    options = SolverOptions(time_limit_s=60, deterministic_time_limit=1, num_workers=2)
    fn = remat_opt.optimize(residual_chain, int(0.75 * plain), solver_options=options, cache=False)
    plan = fn.plan(ws, x)
    assert any(s is not None for s in starts)
    assert plan.measured_peak_bytes <= int(0.75 * plain)
    assert plan.recompute_flops > 0
    got = jax.grad(fn)(ws, x)
    want = jax.grad(residual_chain)(ws, x)
    for a, b in zip(got, want):  # the same sums, associated otherwise: float32 rounding of the largest
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7 * float(jnp.abs(b).max()))


@pytest.mark.scripts
def test_block_solve_experiment_runs(tmp_path):
    out = tmp_path / "block_solve.csv"
    table = run_script("block_solve.py", "--layers", "4", "--whole-max-layers", "0", "--milp-max-vars", "0",
                       "--out", str(out))
    (row,) = read_rows(out)
    assert row["blocks_method"] == "blocks" and int(row["blocks"]) == 3
    assert 0 < int(row["blocks_recompute"]) and re.search(r"\| gpt-4 \| \d+ \| 3 \|", table)
