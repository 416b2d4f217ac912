"""Checkmate's MILP against exhaustive search, on tiny graphs, and the solve-time experiment.

What is compared, and why it is a valid check: the MILP encodes Checkmate's
rules *linearly* (``Free`` by two big-M inequalities, memory by the ``U``
recurrence). :func:`pareto` instead enumerates every schedule and evaluates
the rules *directly* (:func:`checkmate_reference.stage_peak`, experiments/checkmate_reference.py), so the two
agree only if the linearization is exact and the solver optimal.

The enumeration is over the kept sets ``S[t]`` (every subset), with ``R[t]``
the smallest set it allows: operation ``t``, the newly kept outputs, and their
inputs' closure through outputs not kept. That loses no optimum. An extra
recomputation costs ``cost >= 0``, adds ``memory >= 0`` and can only *delay*
frees (an output is freed after its last reader in the stage), except for an
input that it alone reads; that input is held in stage ``t`` but never needed
there nor kept on, and dropping it from ``S[t]`` (a set the search also
tries) lowers memory in stage ``t`` and removes a hazard in stage ``t - 1``.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from checkmate_reference import (  # noqa: E402
    CheckmateGraph,
    from_program_graph,
    simulate_stages,
    solve_checkmate,
    stage_peak,
    store_all,
)
from remat_opt.memory import model_graph
from remat_opt.program import trace

ROOT = Path(__file__).resolve().parents[1]


def pareto(cg: CheckmateGraph) -> list[tuple[int, int]]:
    """Every (peak bytes, recompute cost) trade-off of ``cg`` that no other schedule beats."""
    n = cg.size
    fronts: dict[frozenset[int], list[tuple[int, int]]] = {frozenset(): [(0, 0)]}
    for t in range(n):
        nxt: dict[frozenset[int], list[tuple[int, int]]] = {}
        choices = range(t + 1) if t + 1 < n else ()
        for keep, front in fronts.items():
            for r in range(len(choices) + 1):
                for keep_next in map(frozenset, itertools.combinations(choices, r)):
                    compute, stack = {t, *(keep_next - keep)}, [t, *(keep_next - keep)]
                    while stack:
                        for u in cg.preds[stack.pop()]:
                            if u not in keep and u not in compute:
                                compute.add(u)
                                stack.append(u)
                    peak = stage_peak(cg, t, frozenset(compute), keep, keep_next)
                    cost = sum(cg.cost[i] for i in compute)
                    nxt.setdefault(keep_next, []).extend((max(p, peak), c + cost) for p, c in front)
        fronts = {k: _nondominated(v) for k, v in nxt.items()}
    return [(cg.base_bytes + p, c - sum(cg.cost)) for p, c in _nondominated(fronts[frozenset()])]


def _nondominated(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p, c in sorted(set(points)):
        if not out or c < out[-1][1]:
            out.append((p, c))
    return out


def random_graph(seed: int, n: int = 8) -> CheckmateGraph:
    """A forward chain with skips, then its mirrored backward (Checkmate's gradient graphs)."""
    rng = random.Random(seed)
    half = n // 2
    edges = {(i, i + 1) for i in range(n - 1)}
    edges |= {(i, j) for i in range(half) for j in range(i + 2, half) if rng.random() < 0.3}
    edges |= {(i, n - 1 - i) for i in range(half - 1)}  # the backward of i reads i's output
    return CheckmateGraph(
        labels=tuple(f"op{i}" for i in range(n)),
        cost=tuple(rng.choice((1, 2, 3, 5)) for _ in range(n)),
        memory=tuple(rng.choice((4, 8, 12, 16)) for _ in range(n)),
        edges=tuple(sorted(edges)),
        base_bytes=100,
        num_forward=half,
    )


def _tiny_program():
    """sum(sin(tanh(x @ w))): 5 forward operations (with the derived cos) and 4 backward."""
    def fn(w, x):
        return jnp.sum(jnp.sin(jnp.tanh(x @ w)))

    w = jnp.linspace(-1.0, 1.0, 64).reshape(8, 8)
    return from_program_graph(model_graph(trace(fn, (w, jnp.ones((16, 8))), {}, (0,))))


def _check_against_brute_force(cg: CheckmateGraph) -> int:
    front = pareto(cg)
    assert front[-1][1] == 0 and front[-1][0] == simulate_stages(cg, *store_all(cg))[0]
    for peak, cost in front:
        solution = solve_checkmate(cg, peak, time_limit_s=20, num_threads=1)
        assert solution.status == "OPTIMAL", (peak, solution)
        assert math.isclose(solution.recompute_cost, cost) and solution.gap == 0
        got_peak, got_cost = simulate_stages(cg, solution.compute, solution.keep)
        assert got_peak <= peak and got_cost == cost
    lowest = front[0][0]
    assert solve_checkmate(cg, lowest - 1, time_limit_s=20).status == "INFEASIBLE"
    return len(front)


@pytest.mark.parametrize("seed", [1, 4, 6])
def test_milp_optimum_equals_brute_force_on_random_graphs(seed):
    assert _check_against_brute_force(random_graph(seed)) >= 2, "the graph should offer a trade-off"


def test_milp_optimum_equals_brute_force_on_a_program_graph():
    cg = _tiny_program()
    assert cg.size == 9 and cg.num_forward == 5
    assert "f6:cos" in cg.labels  # the residual of sin's JVP is a forward operation of its own
    assert _check_against_brute_force(cg) >= 2


def test_three_layer_mlp_corners():
    """On the brief's 3-layer tanh MLP (16 operations, too many to enumerate): the corners."""
    def mlp(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x**2)

    graph = model_graph(trace(mlp, ([jnp.full((8, 8), 0.1)] * 3, jnp.ones((16, 8))), {}, (0,)))
    cg = from_program_graph(graph)
    assert cg.size == 16 and cg.base_bytes == graph.input_bytes + graph.output_bytes
    everything, _ = simulate_stages(cg, *store_all(cg))
    assert solve_checkmate(cg, everything, time_limit_s=20).recompute_cost == 0
    # Stage t holds operation t's output and its inputs: a floor no schedule goes below.
    floor = cg.base_bytes + max(cg.memory[t] + sum(cg.memory[u] for u in cg.preds[t]) for t in range(cg.size))
    assert solve_checkmate(cg, floor - 1, time_limit_s=20).status == "INFEASIBLE"
    costs = []
    for budget in (everything, (everything + floor) // 2, floor + 512):
        solution = solve_checkmate(cg, budget, time_limit_s=20)
        if solution.feasible:
            peak, cost = simulate_stages(cg, solution.compute, solution.keep)
            assert peak <= budget and cost == solution.recompute_cost
            costs.append(solution.recompute_cost)
    assert costs == sorted(costs) and len(costs) >= 2  # less memory never costs less


def test_rejects_bad_arguments():
    cg = random_graph(0)
    with pytest.raises(ValueError, match="backend"):
        solve_checkmate(cg, 1000, backend="GUROBI")
    with pytest.raises(ValueError, match="time_limit_s"):
        solve_checkmate(cg, 1000, time_limit_s=0)
    with pytest.raises(ValueError, match="topological"):
        CheckmateGraph(("a", "b"), (1, 1), (1, 1), ((1, 0),))


def test_solve_time_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("solve_time", ROOT / "experiments" / "solve_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    start = time.perf_counter()
    rows = module.main(["--quick", "--out-dir", str(tmp_path)])
    assert time.perf_counter() - start < 60
    assert (tmp_path / "solve_time.csv").exists() and (tmp_path / "solve_time.png").exists()
    assert [row["model"] for row in rows] == ["mlp-2", "mlp-4"]
    assert all(row["cpsat_status"] == "OPTIMAL" for row in rows)
    assert rows[0]["milp_status"] == "OPTIMAL"  # 24 operations; at 40, SCIP may hit the 10 s limit
    assert all(row["milp_status"] in ("OPTIMAL", "FEASIBLE", "UNKNOWN") for row in rows)
