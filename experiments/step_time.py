"""The step-time table: remat_opt against the one-line policies, on whatever device is here.

For each program and each budget, side by side in one process:

* ``plain``: the program as written (on a TPU or GPU, XLA rematerializes by
  itself when it does not fit the device);
* ``layer/<policy>``: ``jax.checkpoint(layer, policy=...)`` around each layer,
  as a user writes it (the zoo's ``layer_wrapper``; a scanned model's body;
  ``nn.remat`` inside Flax's ``nn.scan``);
* ``maxtext/<recipe>``: each MaxText ``remat_policy`` recipe on the scan body,
  where the program carries MaxText's names (the scanned programs);
* ``remat_opt``: ``remat_opt.optimize(loss, budget, cache=False)`` (its
  default objective: step time on an accelerator, FLOPs on the CPU).

Budgets: each per-layer built-in policy's XLA peak, and ``--fractions`` of the plain
peak. Each row has XLA's peak (argument + output + temp - alias of
``memory_analysis()``), whether it fits the budget, the median step time over
``--repeats`` runs after a warm-up (``jax.jit(jax.value_and_grad(f))`` on the
program's own arrays), remat_opt's planning seconds against one compile of
the plain step, and its gradients' largest error against ``jax.grad`` of the
plain loss, over ``atol + rtol |want|`` (rtol 1e-2 and atol 1e-4 on an
accelerator, whose float32 matrix products run at bf16 passes by default;
1e-5 and 1e-6 on the CPU). Because on a TPU any change of order moves those
roundings, each row also has ``grad_error_vs_highest``: its gradients' distance
from the plain step's at ``jax.default_matmul_precision("highest")``, relative
to their size; a plan is as accurate as the program as written when its figure
is no larger than the plain row's.

Usage:
    python experiments/step_time.py [--programs gpt6,gpt12,resnet,gpt_scan,flax_scan] [--fractions 0.5,0.3]
                                    [--repeats 10] [--budgets device] [--objective auto] [--out DIR] [--log]
                                    [--quick | --peaks dots_saveable]

Writes ``<out>/step_time_<platform>.csv`` after each program, stamped with the
jax version, machine and device.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import remat_opt
from remat_opt.baselines import RECIPES, recipe_program
from remat_opt.zoo import MODELS, GPTConfig, ResNetConfig
from remat_opt.zoo.gpt import scan_loss, stack_layers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command, stamp, write_csv  # noqa: E402
import heldout_scan_programs  # noqa: E402
from heldout_scan_programs import Sizes  # noqa: E402

POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")
# MaxText's recipes, where a program carries their names ("full" is ``layer/nothing_saveable``).
MAXTEXT = tuple(r for r in RECIPES if r != "full")
Build = Callable[[], tuple[Callable[..., Any], tuple, dict[str, Callable[..., Any]]]]
"""A program: its loss, its arguments, and its one-line baselines by strategy name."""


def zoo(family: str, config: Any) -> Build:
    """A zoo model, with each built-in policy around each layer (the zoo's ``layer_wrapper``)."""
    def build():
        spec = MODELS[family]
        params, batch = spec.init(config, jax.random.key(0))
        menu = {f"layer/{p}": functools.partial(spec.loss, layer_wrapper=lambda f, p=p: jax.checkpoint(
            f, policy=getattr(jax.checkpoint_policies, p))) for p in POLICIES}
        return spec.loss, (params, batch), menu
    return build


def scanned_gpt(config: GPTConfig) -> Build:
    """The zoo GPT with its layers in one ``lax.scan``, tagged with MaxText's names: each built-in
    policy and each MaxText recipe on the body."""
    def build():
        params, batch = MODELS["gpt"].init(config, jax.random.key(0))
        menu = {f"layer/{p}": functools.partial(scan_loss, body_policy=getattr(jax.checkpoint_policies, p))
                for p in POLICIES}
        menu |= {f"maxtext/{r}": recipe_program(scan_loss, r) for r in MAXTEXT}
        return scan_loss, (stack_layers(params), batch), menu
    return build


def library_scan(factory: str, sizes: Any) -> Build:
    """A decoder of ``experiments/heldout_scan_programs.py`` (``factory``), its layers in a scan as
    its library's users write it, with the library's own remat of the layer under each built-in
    policy and each MaxText recipe."""
    def build():
        make = getattr(heldout_scan_programs, factory)
        menu = {f"layer/{p}": make(sizes, p).loss for p in POLICIES}
        menu |= {f"maxtext/{r}": make(sizes, r).loss for r in MAXTEXT}
        program = make(sizes)
        return program.loss, program.args, menu
    return build


def tapered_mlp(batch: int, widths: tuple[int, ...], classes: int) -> Build:
    """A classifier MLP whose layers all differ in width (gelu, layer norm, no residuals): no two
    layers alike, so no ``layer_wrapper`` a user could write once. Its one-line alternatives are a
    checkpoint around the whole loss under each built-in policy (``whole/<policy>``)."""
    def build():
        keys = jax.random.split(jax.random.key(7), len(widths) + 2)
        sizes = (*widths, classes)
        params = [jax.random.normal(k, (a, b), jnp.float32) / a ** 0.5 for k, a, b in zip(keys, sizes, sizes[1:])]
        x = jax.random.normal(keys[-2], (batch, widths[0]), jnp.float32)
        y = jax.random.randint(keys[-1], (batch,), 0, classes)

        def loss(params, x, y):
            h = x
            for w in params[:-1]:
                h = h @ w
                h = jax.nn.gelu((h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5))
            logits = h @ params[-1]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=-1))

        menu = {f"whole/{p}": jax.checkpoint(loss, policy=getattr(jax.checkpoint_policies, p)) for p in POLICIES}
        return loss, (params, x, y), menu
    return build


GPT = dict(d_model=768, num_heads=12, seq_len=1024, batch=4, vocab=8192)
FLAX = Sizes(layers=12, d_model=768, heads=12, seq=1024, batch=4, vocab=8192)
PROGRAMS: dict[str, Build] = {
    "gpt6": zoo("gpt", GPTConfig(num_layers=6, **GPT)),
    "gpt12": zoo("gpt", GPTConfig(num_layers=12, **GPT)),
    "resnet": zoo("resnet", ResNetConfig(image_size=64, widths=(64, 128, 256), blocks_per_stage=2, batch=64)),
    "gpt_scan": scanned_gpt(GPTConfig(num_layers=12, **GPT)),
    # The same 6-layer GPT at batch 32: its plain step does not fit a 16 GiB device unrematerialized.
    "gpt6_b32": zoo("gpt", GPTConfig(num_layers=6, **{**GPT, "batch": 32})),
    # The GPT's sizes written in Flax Linen (development: its first TPU run, session 42, made the
    # step-time search measure MaxText's recipes and shares of the time-chosen bytes) and in Flax
    # NNX (held out, chosen as its replacement before it was run).
    "flax_scan": library_scan("flax_linen_scan", FLAX),
    "flax_nnx_scan": library_scan("flax_nnx_scan", FLAX),
    # The same sizes in Equinox (held out: chosen in session 45 as the TPU's second evaluation
    # program before it was ever run there; no rule has been changed for it).
    "equinox_scan": library_scan("equinox_scan", FLAX),
    # Held out (chosen in session 48 before it was run anywhere, as the TPU's program with no
    # repeated layer: every layer has its own widths).
    "tapered_mlp": tapered_mlp(16384, (1024, 4096, 8192, 2048, 6144, 3072, 1024), 1000),
    # CPU-sized, for the suite's smoke test of this script.
    "tiny_gpt": zoo("gpt", GPTConfig(num_layers=3, d_model=32, num_heads=2, seq_len=16, batch=2, vocab=64)),
    "tiny_gpt_scan": scanned_gpt(GPTConfig(num_layers=3, d_model=32, num_heads=2, seq_len=16, batch=2, vocab=64)),
    "tiny_flax_scan": library_scan("flax_linen_scan", Sizes(layers=3, d_model=32, heads=2, seq=16, batch=2, vocab=64)),
}


def compiled_step(loss: Callable[..., Any], args: tuple) -> tuple[Any, int, float]:
    """``jax.jit(jax.value_and_grad(loss))`` compiled: the executable, XLA's peak, the compile seconds."""
    started = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
    seconds = time.perf_counter() - started
    m = compiled.memory_analysis()
    peak = int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    return compiled, peak, seconds


def medians(executables: list[Any], args: tuple, repeats: int) -> list[float]:
    """The median step time of each executable, run in turn (one step each, ``repeats`` rounds,
    after a warm-up), so that drift of the device's clock or heat falls on all alike."""
    for ex in executables:
        jax.block_until_ready(ex(*args))
    times: list[list[float]] = [[] for _ in executables]
    for _ in range(repeats):
        for ex, t in zip(executables, times):
            started = time.perf_counter()
            jax.block_until_ready(ex(*args))
            t.append(time.perf_counter() - started)
    return [statistics.median(t) for t in times]


def grad_error(got: Any, want: Any, rtol: float, atol: float) -> float:
    """The largest ``|got - want| / (atol + rtol |want|)`` over every leaf."""
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)) / (atol + rtol * np.abs(np.asarray(w)))))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def relative_error(got: Any, reference: Any) -> float:
    """``||got - reference|| / ||reference||``, the 2-norms over every leaf together: how far
    gradients are from a reference, in units of its size (a leaf whose true gradient is zero, such
    as attention's key bias, would make any per-leaf ratio meaningless)."""
    pairs = [(np.asarray(g, np.float64), np.asarray(r, np.float64))
             for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(reference))]
    diff = sum(float(np.sum((g - r) ** 2)) for g, r in pairs)
    size = sum(float(np.sum(r ** 2)) for _, r in pairs)
    return (diff / size) ** 0.5 if size else diff ** 0.5


def reference_gradients(loss: Callable, args: tuple) -> Any:
    """The plain step's gradients with every matmul at float32 precision (``"highest"``): on a TPU,
    whose default float32 matmul rounds its operands to bfloat16, the yardstick against which the
    plain step, each baseline and each plan are each measured (the ``grad_error_vs_highest`` columns).
    On the CPU it is the plain step itself."""
    with jax.default_matmul_precision("highest"):
        compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
    return compiled(*args)[1]


def baseline_rows(name: str, loss: Callable, args: tuple, menu: dict[str, Callable], repeats: int
                  ) -> tuple[list, dict[str, Any], tuple[Any, Any]]:
    """The plain step's and each one-line baseline's rows, their executables, and the gradients of the
    plain step and of :func:`reference_gradients`."""
    rows, executables = [], {}
    programs = {"plain": loss, **menu}
    for strategy, program in programs.items():
        try:
            executables[strategy], peak, compile_s = compiled_step(program, args)
        except Exception as err:  # noqa: BLE001 - a policy the device cannot fit: a row says so
            rows.append({"program": name, "kind": "layer", "strategy": strategy,
                         "exception": f"{type(err).__name__}: {str(err)[:200]}"})
            continue
        rows.append({"program": name, "kind": "plain" if strategy == "plain" else "layer", "strategy": strategy,
                     "peak_bytes": peak, "compile_s": round(compile_s, 2)})
    ready = [r for r in rows if r["strategy"] in executables]
    for r, ms in zip(ready, medians([executables[r["strategy"]] for r in ready], args, repeats)):
        r["step_ms"] = round(1e3 * ms, 3)
    want = executables["plain"](*args)[1] if "plain" in executables else None
    try:
        reference = reference_gradients(loss, args)
    except Exception as err:  # noqa: BLE001 - a reference the device cannot hold beside the rest: no column
        print(f"  no float32-precision reference: {type(err).__name__}: {str(err)[:200]}", flush=True)
        reference = None
    for r in ready:
        if reference is not None:
            r["grad_error_vs_highest"] = float(f"{relative_error(executables[r['strategy']](*args)[1], reference):.3g}")
    return rows, executables, (want, reference)


def plan_row(name: str, loss: Callable, args: tuple, budget: int, budget_name: str, baselines: list,
             executables: dict, gradients: tuple[Any, Any], repeats: int, tolerance: tuple[float, float],
             objective: str) -> dict:
    """remat_opt at ``budget``: its plan, planning seconds, peak, gradient error, and its step time
    beside the fastest baseline that fits the same budget, timed in turn with it."""
    fitting = [r for r in baselines if r.get("peak_bytes") is not None and r["peak_bytes"] <= budget]
    best = min(fitting, key=lambda r: r["step_ms"], default=None)
    row: dict[str, Any] = {"program": name, "kind": "plan", "strategy": "remat_opt", "budget": budget_name,
                           "budget_bytes": budget, "best_baseline": best and best["strategy"]}
    step = remat_opt.optimize(loss, budget, cache=False, objective=objective)
    started = time.perf_counter()
    try:
        plan = step.plan(*args)
    except remat_opt.InfeasibleBudgetError as err:
        return {**row, "plan_s": round(time.perf_counter() - started, 2), "exception": str(err)[:300]}
    row["plan_s"] = round(time.perf_counter() - started, 2)
    executable, peak, _ = compiled_step(step, args)
    row.update(peak_bytes=peak, fits=peak <= budget, predicted_peak_bytes=plan.predicted_peak_bytes,
               status=plan.status, recompute_fraction=round(plan.recompute_overhead, 4),
               plan=str(plan.layer_plan or plan.loop_plan or plan.whole_policy or
                        (plan.schedule and not plan.schedule.plain and f"{plan.num_segments} segments") or "plain"),
               candidates=len(plan.timed))
    want, reference = gradients
    grads = executable(*args)[1]
    row["grad_error_over_tolerance"] = round(grad_error(grads, want, *tolerance), 4)
    if reference is not None:
        row["grad_error_vs_highest"] = float(f"{relative_error(grads, reference):.3g}")
    if best is None:
        row["step_ms"] = round(1e3 * medians([executable], args, repeats)[0], 3)
        return row
    ours, theirs = medians([executable, executables[best["strategy"]]], args, repeats)
    row["baseline_grad_error_over_tolerance"] = round(
        grad_error(executables[best["strategy"]](*args)[1], want, *tolerance), 4)
    row.update(step_ms=round(1e3 * ours, 3), best_baseline_ms=round(1e3 * theirs, 3),
               vs_best=round(ours / theirs - 1, 4))
    return row


def run(name: str, fractions: tuple[float, ...], repeats: int, tolerance: tuple[float, float],
        extra_budgets: tuple[str, ...] = (), objective: str = "auto", peaks: tuple[str, ...] | None = None
        ) -> Iterator[dict]:
    loss, args, menu = PROGRAMS[name]()
    baselines, executables, gradients = baseline_rows(name, loss, args, menu, repeats)
    plain = baselines[0]
    for r in baselines:
        print(f"  {r['strategy']:<40} peak {r.get('peak_bytes', 0) / 2**30:7.3f} GiB  step {r.get('step_ms')} ms",
              flush=True)
    budgets = [(f"{r['strategy']} peak", r["peak_bytes"]) for r in baselines if r["strategy"].startswith("layer/")
               and r.get("peak_bytes") and (peaks is None or r["strategy"].removeprefix("layer/") in peaks)]
    budgets += [(f"{f} x plain", int(f * plain["peak_bytes"])) for f in fractions]
    budgets += [(b, remat_opt.device_memory() if b == "device" else remat_opt.parse_bytes(b)) for b in extra_budgets]
    yield from baselines
    for budget_name, budget in budgets:
        try:
            row = plan_row(name, loss, args, budget, budget_name, baselines, executables, gradients, repeats,
                           tolerance, objective)
        except Exception as err:  # noqa: BLE001 - recorded; the run goes on
            traceback.print_exc()
            row = {"program": name, "kind": "plan", "budget": budget_name, "budget_bytes": budget,
                   "exception": f"{type(err).__name__}: {str(err)[:300]}"}
        row["plain_compile_s"] = plain.get("compile_s")
        print(f"  remat_opt at {budget_name}: {row}", flush=True)
        yield row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=lambda s: [p for p in s.split(",") if p],
                        default=["gpt6", "gpt12", "resnet", "gpt_scan"])
    parser.add_argument("--fractions", type=lambda s: tuple(float(f) for f in s.split(",") if f), default=(0.5, 0.3))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budgets", type=lambda s: tuple(b for b in s.split(",") if b), default=(),
                        help="more budgets, as sizes ('12GiB') or 'device' (the device's memory)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--objective", default="auto", choices=("auto", "time", "flops"),
                        help="optimize's objective (auto: step time on an accelerator, FLOPs on the CPU)")
    parser.add_argument("--quick", action="store_true", help="plan at --fractions only, not at each policy's peak")
    parser.add_argument("--peaks", type=lambda s: tuple(p for p in s.split(",") if p), default=None,
                        help="plan at these policies' peaks only (comma-separated; default: every policy's)")
    parser.add_argument("--log", action="store_true", help="remat_opt's progress at INFO level")
    args = parser.parse_args(argv)
    if args.log:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = jax.devices()[0]
    tolerance = (1e-5, 1e-6) if device.platform == "cpu" else (1e-2, 1e-4)
    header = f"{stamp()}; device {device.platform} {device.device_kind} x{jax.device_count()}\nreproduce: {command()}"
    print(header, flush=True)
    rows: list[dict] = []
    path = args.out / f"step_time_{device.platform}.csv"
    for name in args.programs:
        print(f"{name}:", flush=True)
        for row in run(name, args.fractions, args.repeats, tolerance, args.budgets, args.objective,
                       () if args.quick else args.peaks):
            rows.append(row)
            write_csv(path, rows, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
