"""Compiling candidate steps side by side, and timing them on the device.

The step-time search (:mod:`remat_opt.planner._timed`) judges a candidate by two
figures the device gives: XLA's peak (:func:`remat_opt.memory._measure.memory_of`)
and the median wall time of the compiled step on arguments of the planned
shapes. A candidate XLA cannot fit into the device (``RESOURCE_EXHAUSTED``,
at compile or at run) does not fit: it is a figure, never a crash.

Tracing and lowering run one at a time (Python); XLA's compiles run in a
thread pool, as XLA releases the interpreter while it compiles. Candidates that
lower to the same module (two per-layer policies that save the same values, as
the two dot policies do on a network without batched matmuls) are compiled once.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ._measure import abstract, gradient_step, memory_of


@dataclass(frozen=True)
class Compiled:
    """One candidate step compiled: its executable, peak and compile seconds, or why it has none.

    Attributes:
        executable: the compiled gradient step (``None`` when it did not compile).
        peak_bytes: XLA's peak (argument + output + temp - alias), ``None`` when it did not compile.
        seconds: wall time of the lowering and compile.
        error: why it did not compile (``RESOURCE_EXHAUSTED: ...``), else ``None``.
        step_args: the arguments the executable takes, as abstract values.
    """

    executable: Any
    peak_bytes: int | None
    seconds: float
    error: str | None
    step_args: tuple


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is XLA saying the program does not fit the device."""
    text = f"{type(err).__name__}: {err}"
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text.lower()


def compile_steps(programs: Sequence[Callable[..., Any]], args: tuple, kwargs: dict, argnums: Any,
                  has_aux: bool, workers: int | None = None) -> list[Compiled]:
    """Each program's ``jax.value_and_grad`` step, lowered in turn and compiled in parallel; programs
    whose steps lower to the same module share one :class:`Compiled` (the same object).

    Raises:
        Exception: whatever a lowering or compile raises, except XLA's out-of-memory
            error, which is the candidate's ``error``.
    """
    lowered = []
    for program in programs:
        started = time.perf_counter()
        step, step_args, step_kwargs = gradient_step(program, args, kwargs, argnums, has_aux)
        specs = (abstract(step_args), abstract(step_kwargs))
        try:
            low = jax.jit(step).trace(*specs[0], **specs[1]).lower()
        except Exception as err:  # noqa: BLE001 - only XLA's out-of-memory is a figure
            if not out_of_memory(err):
                raise
            low = err
        lowered.append((low, time.perf_counter() - started, specs))

    def build(item: tuple) -> Compiled:
        low, seconds, specs = item
        started = time.perf_counter()
        if isinstance(low, BaseException):
            return Compiled(None, None, seconds, f"{type(low).__name__}: {low}", specs)
        try:
            executable = low.compile()
            peak = memory_of(executable)
        except Exception as err:  # noqa: BLE001 - only XLA's out-of-memory is a figure
            if not out_of_memory(err):
                raise
            return Compiled(None, None, seconds + time.perf_counter() - started, _short(err), specs)
        return Compiled(executable, peak, seconds + time.perf_counter() - started, None, specs)

    first: dict[str, int] = {}  # a module's text (its name aside) -> the first candidate that lowered to it
    same = [first.setdefault(_module_body(low), k) if not isinstance(low, BaseException) else k
            for k, (low, _, _) in enumerate(lowered)]
    distinct = sorted(set(same))
    workers = workers or min(len(distinct), max(1, (os.cpu_count() or 2) - 1), 8)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        built = dict(zip(distinct, pool.map(build, [lowered[k] for k in distinct])))
    return [built[k] for k in same]


def _module_body(lowered: Any) -> str:
    """The lowered module's text without its name (``@jit_<function name>``)."""
    return re.sub(r"^module @\S+", "module", lowered.as_text(), count=1)


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) < 400 else text[:400] + " ..."


def run_inputs(fn: Callable[..., Any], args: tuple, kwargs: dict, argnums: Any, has_aux: bool,
               specs: tuple) -> tuple:
    """What a compiled step of ``fn`` is run on to time it: the call's own arrays, as the step
    takes them, where every one is a concrete ``jax.Array`` (no second copy of the parameters
    and batch on the device, which a step planned near the device's memory has no room for);
    else (a plan made under ``jax.jit``'s trace, NumPy or Python leaves) :func:`example_arguments`."""
    _, step_args, step_kwargs = gradient_step(fn, args, kwargs, argnums, has_aux)
    leaves = jax.tree_util.tree_leaves((step_args, step_kwargs))
    if leaves and all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves):
        return step_args, step_kwargs
    return example_arguments(specs)


def example_arguments(specs: tuple) -> tuple:
    """Arrays of ``specs``' shapes, dtypes and shardings: zeros (keys from seed 0)."""
    def make(spec: Any) -> Any:
        if not isinstance(spec, jax.ShapeDtypeStruct):
            return spec
        sharding = getattr(spec, "sharding", None)
        if jax.dtypes.issubdtype(spec.dtype, jax.dtypes.prng_key):
            value = jax.random.split(jax.random.key(0), math.prod(spec.shape)).reshape(spec.shape)
        else:
            value = jnp.zeros(spec.shape, spec.dtype)
        return jax.device_put(value, sharding) if sharding is not None else value

    with jax.ensure_compile_time_eval():  # concrete arrays, also when a plan is made under jit's trace
        return jax.tree_util.tree_map(make, specs)


def step_seconds(compiled: Compiled, inputs: tuple, repeats: int = 5) -> float | None:
    """The median wall time of ``repeats`` runs of the compiled step on ``inputs``
    (after one run to warm up); ``None`` when the device runs out of memory."""
    if compiled.executable is None:
        return None
    step_args, step_kwargs = inputs
    try:
        times = _run_times(lambda: compiled.executable(*step_args, **step_kwargs), repeats)
    except Exception as err:  # noqa: BLE001 - only the device's out-of-memory is a figure
        if not out_of_memory(err):
            raise
        return None
    return statistics.median(times)


_RIDGES: dict[tuple[str, str], float] = {}


def device_ridge(dtype: Any = jnp.float32) -> float:
    """The default device's ridge for ``dtype``: the FLOPs its matmuls run in the time its
    elementwise work moves one byte, both timed on the device (once per process and dtype).

    The matmul is ``n x n`` by ``n x n``; the elementwise work scales an array of ``4 * n * n``
    elements in place of itself (reading and writing it). ``n`` is 4096 on an accelerator and 512
    on the CPU, so that the calibration takes a second or less either way.
    """
    key = (jax.default_backend(), jnp.dtype(dtype).name)
    if key not in _RIDGES:
        n = 512 if key[0] == "cpu" else 4096
        with jax.ensure_compile_time_eval():  # arrays, not tracers, under a trace
            a = jnp.ones((n, n), dtype)
            x = jnp.ones((4 * n * n,), dtype)
        matmul = _seconds(jax.jit(lambda a: a @ a), a)
        scale = _seconds(jax.jit(lambda x: x * 1.5 + 1.0), x)
        flops_per_second = 2.0 * n ** 3 / matmul
        bytes_per_second = 2.0 * x.size * x.dtype.itemsize / scale
        _RIDGES[key] = max(1.0, flops_per_second / bytes_per_second)
    return _RIDGES[key]


def _seconds(fn: Callable[..., Any], *args: Any, repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed runs of ``fn`` (after a warm-up)."""
    return min(_run_times(lambda: fn(*args), repeats))


def _run_times(run: Callable[[], Any], repeats: int) -> list[float]:
    """The wall times of ``repeats`` runs of ``run``, each to completion on the device, after one
    run to warm up. Run, not staged, also where the plan is made inside a trace (a step planned
    when ``jax.jit`` first traces it)."""
    with jax.ensure_compile_time_eval():
        jax.block_until_ready(run())
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            jax.block_until_ready(run())
            times.append(time.perf_counter() - started)
    return times
