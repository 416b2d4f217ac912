"""The memory model on the backend at hand (a GPU, say): predicted against XLA's peak.

Every rule of the model was written and checked on XLA:CPU. What it reads from
the compiled program (held buffers, fusion, the transposes' scratch) it reads
from whatever backend compiles it, so this script asks the question on
another one: for three zoo models and two library models (Flax NNX and
Equinox, from ``heldout_programs``), each through remat_opt's public API:

* ``plain``, ``schedule`` (Chen's sqrt(n) and greedy segmentations): the
  model's predicted peak against ``compiled.memory_analysis()``;
* ``policy``: ``jax.checkpoint`` around the loss with ``nothing_saveable``
  and ``dots_saveable``, measured only, for the plans' best baseline;
* ``plan``: :func:`remat_opt.optimize` at ``--fractions`` of the plain peak:
  predicted and measured peak, recomputed FLOPs, and then the optimized step
  run on the device: its gradients against ``jax.grad`` of the plain loss
  (the largest ``|got - want| / (atol + rtol |want|)``, rtol 1e-5, atol 1e-6;
  float32 matrix products run at the backend's default precision, so on a GPU
  this is a figure, not a pass/fail), and its median step time beside the
  plain step's.

With ``--buffers``, XLA's largest allocations for the plain step and each plan's, and the
largest values in each, go to ``<out>/device_check_buffers.txt`` (from the compile's
buffer-assignment dump): where a prediction and XLA's peak part, what XLA holds.

Rows go to ``<out>/device_check.csv`` after every program, stamped with the
jax version, the machine and the device kind (with ``--label L``, the files are
``device_check_L.csv`` and ``device_check_L_buffers.txt``). No program is started after
``--deadline-s`` seconds, so a run fits a device lease; the rows written so
far stay. Nothing here is tuned: the fractions and programs were fixed before
the first run on a GPU.

Usage:
    python experiments/device_check.py [--out DIR] [--fractions 0.8,0.6] [--deadline-s 420]
                                       [--programs zoo_gpt,flax_nnx_vit] [--policies dots_saveable]
                                       [--schedules chen_sqrt_n] [--buffers]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from remat_opt.memory._compiled import compile_dumped
from remat_opt.memory import abstract, gradient_step
from remat_opt.zoo import MODELS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, MiB, command, grad_error_over_tolerance, stamp, write_csv  # noqa: E402
from heldout import COLUMNS, SOLVER, measure_baselines, measure_plan, source, summary  # noqa: E402
from heldout_programs import PROGRAMS as HELDOUT, Program  # noqa: E402

POLICIES = ("nothing_saveable", "dots_saveable")
SCHEDULES = ("chen_sqrt_n", "chen_greedy")
EXTRA = ("plain_step_ms", "step_ms", "grad_error_over_tolerance")
REPEATS = 5


def zoo_program(family: str) -> Callable[[], Program]:
    """The zoo model ``family`` at its default configuration, as a held-out :class:`Program`."""
    def build() -> Program:
        spec = MODELS[family]
        params, batch = spec.init(spec.default_config, jax.random.key(0))
        return Program(spec.loss, (params, batch), f"zoo {family} {spec.default_config}")
    return build


PROGRAMS: dict[str, Callable[[], Program]] = {
    "zoo_gpt": zoo_program("gpt"),
    "flax_nnx_vit": HELDOUT["flax_nnx_vit"],
    "equinox_transformer": HELDOUT["equinox_transformer"],
    "zoo_resnet": zoo_program("resnet"),
    "zoo_unet": zoo_program("unet"),
    "zoo_mlp": zoo_program("mlp"),  # not run by default: the suite's smoke test of this script
}
DEFAULT = ("zoo_gpt", "flax_nnx_vit", "equinox_transformer", "zoo_resnet", "zoo_unet")


def timed_gradients(loss: Callable[..., Any], program: Program) -> tuple[Any, float]:
    """The gradients of ``loss`` on the program's arguments, and the median step time in ms.

    Through Equinox's filters, so that a leaf JAX cannot trace (an Equinox
    module's activation, say) is static, as ``optimize`` treats it; every
    program here differentiates its first argument."""
    import equinox as eqx

    assert program.argnums == 0, program.argnums
    step = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    _, grads = jax.block_until_ready(step(*program.args))
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        jax.block_until_ready(step(*program.args))
        times.append(time.perf_counter() - t)
    return grads, round(1e3 * statistics.median(times), 3)


def on_device(program: Program, step: Callable[..., Any], want: Any) -> dict:
    """The optimized ``step`` run here: its gradients against ``want``, and its step time."""
    got, ms = timed_gradients(step, program)
    return {"grad_error_over_tolerance": grad_error_over_tolerance(filtered(got), filtered(want)), "step_ms": ms}


def filtered(grads: Any) -> list[Any]:
    """The array leaves of a gradient pytree (Equinox puts ``None`` where a leaf is static)."""
    return [g for g in jax.tree.leaves(grads) if hasattr(g, "dtype")]


def largest_buffers(loss: Callable[..., Any], program: Program, top: int = 8, values: int = 6) -> str:
    """XLA's ``top`` largest allocations for the gradient step of ``loss`` on this backend, each
    with its ``values`` largest values, from the compile's buffer-assignment dump: what XLA
    holds where the model's prediction and XLA's peak part."""
    step, step_args, step_kwargs = gradient_step(loss, program.args, {}, program.argnums, False)
    _, text = compile_dumped(step, "buffer-assignment.txt", *abstract(step_args), **abstract(step_kwargs))
    allocations: list[tuple[int, str, list[tuple[int, str]]]] = []
    for line in (text or "").splitlines():
        if match := re.match(r"allocation \d+: size (\d+)", line):
            allocations.append((int(match[1]), line, []))
        elif allocations and (match := re.match(r" value: .*\(size=(\d+),", line)):
            allocations[-1][2].append((int(match[1]), line.strip()))
    out = []
    for size, header, held in sorted(allocations, key=lambda a: -a[0])[:top]:
        out.append(f"{size / MiB:9.3f} MiB  {header}")
        out += [f"      {v / MiB:9.3f} MiB  {line[:200]}" for v, line in sorted(held, key=lambda v: -v[0])[:values]]
    return "\n".join(out)


def run_program(name: str, fractions: tuple[float, ...], label: str, policies: tuple[str, ...] = POLICIES,
                schedules: tuple[str, ...] = SCHEDULES, buffers: Path | None = None) -> list[dict]:
    """The rows of one program: baselines, then a plan per fraction, each run on the device;
    with ``buffers``, XLA's largest allocations for the plain step and each plan's, appended there."""
    base = {"label": label, "program": name}
    try:
        program = PROGRAMS[name]()
    except Exception as err:  # noqa: BLE001 - a missing library, say: a row says so, the run goes on
        traceback.print_exc()
        return [{**base, "kind": "plain", "strategy": "build", "exception": f"{type(err).__name__}: {err}"}]
    print(f"{name}: {program.description}", flush=True)
    rows = measure_baselines(program, base, policies, schedules)
    if rows[0].get("plain_peak_bytes") is None:
        return rows
    want, plain_ms = timed_gradients(program.loss, program)
    rows[0]["step_ms"] = plain_ms
    dump(buffers, f"{name} plain", lambda: largest_buffers(program.loss, program))
    for fraction in fractions:
        row, step = measure_plan(program, fraction, rows, SOLVER)
        if step is not None:
            try:
                row.update(on_device(program, step, want), plain_step_ms=plain_ms)
            except Exception as err:  # noqa: BLE001 - recorded; the run goes on
                traceback.print_exc()
                row["exception"] = f"{type(err).__name__}: {err}"
            print(f"    gradients {row.get('grad_error_over_tolerance')} x tolerance, "
                  f"step {row.get('step_ms')} ms (plain {plain_ms} ms)", flush=True)
            dump(buffers, f"{name} plan at {fraction}", lambda: largest_buffers(step, program))
        rows.append(row)
    return rows


def dump(path: Path | None, title: str, text: Callable[[], str]) -> None:
    """``text()`` appended to ``path`` under ``title`` (nothing without a path); a failure is written instead."""
    if path is None:
        return
    try:
        body = text()
    except Exception as err:  # noqa: BLE001 - a diagnostic: the run goes on
        body = f"{type(err).__name__}: {err}"
    with path.open("a") as f:
        f.write(f"== {title}\n{body}\n\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=lambda s: [p for p in s.split(",") if p], default=list(DEFAULT),
                        help=f"comma-separated names, of: {', '.join(PROGRAMS)}")
    parser.add_argument("--fractions", type=lambda s: tuple(float(f) for f in s.split(",")), default=(0.8, 0.6))
    parser.add_argument("--deadline-s", type=float, default=420.0,
                        help="start no program after this many seconds")
    names = lambda s: tuple(n for n in s.split(",") if n)  # noqa: E731
    parser.add_argument("--policies", type=names, default=POLICIES, help="built-in policies measured")
    parser.add_argument("--schedules", type=names, default=SCHEDULES, help="schedules measured")
    parser.add_argument("--buffers", action="store_true",
                        help="also write XLA's largest allocations per step to <out>/device_check_buffers.txt")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="the device's name, in the rows and the output's file name")
    args = parser.parse_args(argv)
    unknown = [n for n in args.programs if n not in PROGRAMS]
    if unknown:
        parser.error(f"unknown programs {unknown}; known: {', '.join(PROGRAMS)}")
    device = jax.devices()[0]
    header = (f"{stamp()}; device {device.platform} {device.device_kind} x{jax.device_count()}\n{source()}\n"
              f"reproduce: {command()}\nlabel: {args.label}; solver: {SOLVER}")
    print(header, flush=True)
    name = f"device_check_{args.label}" if args.label else "device_check"
    path = args.out / f"{name}.csv"
    buffers = args.out / f"{name}_buffers.txt" if args.buffers else None
    if buffers is not None:
        buffers.parent.mkdir(parents=True, exist_ok=True)
        buffers.write_text(f"{header}\n\n")
    start, rows = time.perf_counter(), []
    for name in args.programs:
        if time.perf_counter() - start > args.deadline_s:
            print(f"deadline: {name} and later programs not run", flush=True)
            break
        rows += run_program(name, args.fractions, args.label, args.policies, args.schedules, buffers)
        write_csv(path, [{c: r.get(c) for c in (*COLUMNS, *EXTRA)} for r in rows], header)
        print(f"  [{time.perf_counter() - start:.0f} s]", flush=True)
    print(f"\n{summary(rows)}\n\nwall time {(time.perf_counter() - start) / 60:.1f} min; wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
