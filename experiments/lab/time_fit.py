"""The step-time search's price of a per-layer plan against the device's step times (gpt6, TPU v5e).

The search prices a plan by what it runs again and what it keeps (``layer_cost``: roofline
FLOP-equivalents at the device's ridge). This script splits that price into elementwise,
reduction and other rerun (matmuls) and kept values, for the plans session 49's TPU runs timed
(``experiments/results/tpu_logs/gpt6*_s49.log``: the search's own medians), and fits the step
time as a line in the parts, with and without each part. It runs on the CPU: the graph is the
program's, priced as that search priced it (elementwise rerun as a write; the search has since
priced it as fused), the ridge set to the v5e's (288 FLOPs a byte, float32), and the chosen sets
rebuilt at the caps the logs name. Prints; writes nothing. docs/measurements.md, "Session 49".

    python experiments/lab/time_fit.py
"""

from __future__ import annotations

import numpy as np

import remat_opt.memory._timing as timing
from remat_opt.planner._saved_bytes import layer_bytes, policy_saves, store_cost, store_costs, time_graph
from remat_opt.program._cost import ELEMENTWISE_PRIMITIVES, REDUCTION_PRIMITIVES
from remat_opt.program import build_graph, trace
from remat_opt.program._roofline import RooflineCostModel
from remat_opt.solve import layers_of
from remat_opt.solve._stage_saves import layer_saves, layer_stages, recomputed_units

RIDGE = 288.0
"""The TPU v5e's ridge for float32, as `device_ridge` measured it (docs/design.md §12)."""

POLICY_MS = {"nothing_saveable": 45.8, "dots_with_no_batch_dims_saveable": 45.05, "dots_saveable": 44.08}
"""Every layer under each policy: the search's medians, ms (gpt6_s49.log)."""

CHOSEN_MS = {1403: 44.76, 425: 43.43, 212: 42.5}
"""Every layer saving the values chosen by time in this many MiB: the medians, ms (the 212 MiB
plan ran 42.21 and 42.82 ms in two runs)."""


def parts(graph, layers, saved) -> list[float]:
    """Elementwise, reduction and other rerun, and kept values, in G FLOP-equivalents, summed
    over the layers (``saved``: per layer, the nodes it keeps)."""
    ew = red = other = kept_cost = 0
    for stage, kept in zip(layer_stages(graph, layers), saved):
        own = {v for x in stage.units for v in graph.units[x].outputs if v not in stage.exits}
        kept = frozenset(kept) & own
        for x in recomputed_units(graph, stage, kept) & graph.primal:
            primitive, flops = graph.units[x].primitive, graph.units[x].flops
            if primitive in ELEMENTWISE_PRIMITIVES:
                ew += flops
            elif primitive in REDUCTION_PRIMITIVES:
                red += flops
            else:
                other += flops
        buffers = {graph.buffer[v]: v for v in sorted(kept) if graph.buffer[v] >= 0}
        kept_cost += sum(store_cost(graph, v, RIDGE) for v in buffers.values())
    return [x / 1e9 for x in (ew, red, other, kept_cost)]


def main() -> None:
    import sys
    from pathlib import Path
    # run from experiments/lab/: step_time is in experiments/, one up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from step_time import PROGRAMS

    timing._RIDGES[("cpu", "float32")] = RIDGE  # the v5e's ridge in place of this CPU's
    loss, args, _ = PROGRAMS["gpt6"]()
    traced = trace(loss, args, {}, (0,))
    layers = layers_of(traced)
    graph = build_graph(traced, RooflineCostModel(RIDGE))  # the forward's price, as session 49's search had it
    rows = {p: (parts(graph, layers, [policy_saves(graph, p)] * layers.count), ms) for p, ms in POLICY_MS.items()}
    for mib, ms in CHOSEN_MS.items():
        saved = layer_saves(graph, layers, [mib * 2**20], store=store_costs(graph))[0]
        rows[f"{len(saved)} values in {mib} MiB"] = (parts(graph, layers, [saved] * layers.count), ms)
    print("plan: elementwise, reduction, other rerun, kept (G FLOP-equivalents); ms")
    for label, (p, ms) in rows.items():
        print(f"  {label}: {[round(x) for x in p]}; {ms}")
    x = np.array([[1.0, *p] for p, _ in rows.values()])
    y = np.array([ms for _, ms in rows.values()])
    line = None
    for columns, name in (([0, 1, 2, 3, 4], "all four"), ([0, 2, 3, 4], "no elementwise"),
                          ([0, 3, 4], "other rerun and kept")):
        weights, *_ = np.linalg.lstsq(x[:, columns], y, rcond=None)
        print(f"{name}: weights {np.round(weights, 5)}; misses {np.round(x[:, columns] @ weights - y, 2)} ms")
        line = weights if name == "no elementwise" else line
    rerun = time_graph(traced)  # the search's price now: elementwise rerun fused
    print("the sets the search now chooses at the same caps; the line without elementwise predicts:")
    for mib in (1875, 1403, 936, 468, 425, 319, 212, 106):
        saved = layer_saves(rerun, layers, [mib * 2**20], store=store_costs(rerun))[0]
        p = parts(graph, layers, [saved] * layers.count)
        print(f"  {len(saved)} values in {mib} MiB ({sum(layer_bytes(rerun, layers, saved)) / 2**20:.0f} MiB): "
              f"{[round(v) for v in p]}; {line[0] + line[1:] @ np.array(p[1:]):.2f} ms")


if __name__ == "__main__":
    main()
