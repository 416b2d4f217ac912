"""The largest batch that fits a fixed memory, per strategy (Checkmate's batch-size table).

For each zoo model the memory is fixed (``--memory``; default: XLA's peak for
the model as written at its default config and batch) and, for each strategy,
the batch size is searched: doubling (or halving) from the config's batch until
the answer changes, then bisection to the largest batch that fits, on multiples
of ``--batch-step`` (default: an eighth of the config's batch, so exact for the
zoo's small default batches and within 64 for the MLP's 512).

"Fits" is XLA's word (``remat_opt.peak_bytes``: argument + output + temp −
alias of ``jax.jit(jax.value_and_grad(loss))``) for every strategy:

* ``no_remat``: the loss as written.
* ``checkpoint/<policy>`` and ``layer_checkpoint/<policy>``: the best of JAX's
  built-in policies around the whole loss and around each layer. "Best" is the
  lowest peak at the config's batch; only that policy is searched.
* ``megatron_selective``: Megatron-LM selective recompute (the per-layer
  ``dots_with_no_batch_dims_saveable`` program; same measurements shared).
* ``chen_sqrt_n``: Chen et al.'s sqrt(n) segments through remat_opt's fenced
  rewriter.
* ``revolve``: Griewank's binomial checkpointing as nested fenced checkpoints,
  its lowest-memory schedule (``remat_opt.revolve`` with ``snapshots=None``).
* ``remat_opt``: ``remat_opt.optimize(loss, memory).plan(params, batch)``
  returns a plan (XLA-verified) ⇔ fits; ``InfeasibleBudgetError`` (or another
  ``RematOptError``, reported) ⇔ does not.

The search for a baseline compiles its program only; at the batch found, the
baseline's public function (``remat_opt.no_remat``, ``remat_opt.chen_sqrt_n``,
...) re-measures it as a :class:`remat_opt.Plan`, and that plan's peak and
recompute overhead are what the table shows. The search assumes that "fits"
is monotone in the batch; every probe is written out and a probe that
contradicts it is reported.

Writes ``<stem>.csv`` (one row per model and strategy), ``<stem>.probes.csv``
(every batch tried, with remat_opt's error messages) and ``<stem>.png`` (bar
chart) under ``--out`` (``<stem>`` is ``batch_size``, or ``batch_size.quick``),
stamped with the jax version, the machine and the repository commit.

remat_opt's answers depend on CP-SAT's limit (``--time-limit``): a solve that
stops before finding a schedule counts as "does not fit". The limit is
deterministic time (a quarter of ``--time-limit``), so the answers repeat on a
loaded machine; the wall clock (ten times ``--time-limit``) is a safety net.

Usage:
    python experiments/batch_size.py [--models gpt mlp] [--memory 64MiB] [--time-limit 10] [--out DIR]
    python experiments/batch_size.py --quick       # one small MLP, 2 baselines, about a minute
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax

import remat_opt
from remat_opt.rewrite import _policies
from remat_opt.solve import _chen
from remat_opt.memory import model_graph
from remat_opt.memory import abstract
from remat_opt.rewrite import apply_schedule
from remat_opt.program import trace
from remat_opt.zoo import MODELS, GPTConfig, MLPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

MiB = 2**20
RESULTS = Path(__file__).resolve().parent / "results"
MAX_BATCH = 1 << 16
"""The search stops doubling here (a strategy that fits it is reported as ``>= MAX_BATCH``)."""

QUICK_CONFIGS: dict[str, Any] = {
    "mlp": MLPConfig(depth=16, width=32, batch=128),
    "gpt": GPTConfig(num_layers=2, d_model=32, num_heads=2, seq_len=32, batch=2, vocab=64),
}
QUICK_MODELS = ("mlp",)
QUICK_STRATEGIES = ("no_remat", "chen_sqrt_n", "remat_opt")
ALL_STRATEGIES = (
    "no_remat", "checkpoint", "layer_checkpoint", "megatron_selective", "chen_sqrt_n", "revolve", "remat_opt",
)


def source_version() -> str:
    """The repository's commit, marked when ``src/`` has uncommitted changes (read-only git)."""
    root = Path(__file__).resolve().parents[1]
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", "src").strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + uncommitted changes in src/" if dirty else "")


class Probe(NamedTuple):
    """One batch size tried for one strategy."""

    batch: int
    fits: bool
    peak_bytes: int | None
    seconds: float
    note: str


class Result(NamedTuple):
    """The search's answer for one strategy on one model."""

    strategy: str
    max_batch: int
    plan: remat_opt.Plan | None
    probes: tuple[Probe, ...]
    seconds: float
    note: str


# --------------------------------------------------------------------------- the search


def largest_fitting(
    fits: Callable[[int], bool], start: int, step: int = 1, limit: int = MAX_BATCH
) -> int:
    """The largest multiple ``b`` of ``step`` in ``[step, limit]`` with ``fits(b)``; 0 if none.

    Doubles from ``start`` (a multiple of ``step``) while it fits, or halves
    while it does not, then bisects between the last batch that fits and the
    first that does not, on multiples of ``step``. Assumes ``fits`` is monotone
    (true up to some batch, false after); ``step=1`` finds the exact answer.

    Example:
        >>> largest_fitting(lambda b: b <= 37, start=8)
        37
        >>> largest_fitting(lambda b: b <= 37, start=8, step=4)
        36
    """
    k_limit = max(1, limit // step)
    k = max(1, min(start // step, k_limit))

    def ok(k: int) -> bool:
        return fits(k * step)

    if ok(k):
        lo, hi = k, None
        while hi is None:
            if lo >= k_limit:
                return lo * step
            nxt = min(2 * lo, k_limit)
            if ok(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        lo, hi = 0, k
        while lo == 0 and hi > 1:
            nxt = hi // 2
            if ok(nxt):
                lo = nxt
            else:
                hi = nxt
        if lo == 0:
            return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo * step


def batch_step(config: Any, requested: int | None) -> int:
    """The search's resolution: ``requested``, else an eighth of the config's batch if it divides it."""
    if requested is not None:
        return requested
    step = max(1, config.batch // 8)
    return step if config.batch % step == 0 else 1


# --------------------------------------------------------------------------- strategies


class Model(NamedTuple):
    """One zoo model at one config, with its batch size left free."""

    name: str
    spec: Any
    config: Any

    def args(self, batch: int) -> tuple[Any, Any]:
        """``(params, batch)`` at this batch size, as shapes (nothing is run)."""
        config = dataclasses.replace(self.config, batch=batch)
        return abstract(self.spec.init(config, jax.random.PRNGKey(0)))


def chen_program(loss: Callable[..., Any], args: tuple[Any, Any]) -> Callable[..., Any]:
    """``loss`` rewritten with Chen's sqrt(n) schedule, as ``remat_opt.chen_sqrt_n`` builds it."""
    graph = model_graph(trace(loss, args, {}, (0,)), None)
    return apply_schedule(loss, graph, _chen.chen_sqrt_n_schedule(graph))


def baseline_program(
    strategy: str, loss: Callable[..., Any], args: tuple[Any, Any]
) -> Callable[..., Any]:
    """The program a baseline runs, built the way its public function builds it."""
    kind, _, policy = strategy.partition("/")
    if kind == "no_remat":
        return loss
    if kind == "checkpoint":
        return _policies.policy_program(loss, policy)
    if kind == "layer_checkpoint":
        return _policies.layer_policy_program(loss, policy)
    if kind == "megatron_selective":
        return _policies.layer_policy_program(loss, "dots_with_no_batch_dims_saveable")
    if kind == "chen_sqrt_n":
        return chen_program(loss, args)
    if kind == "revolve":  # its lowest-memory schedule, chosen by measuring, as remat_opt.revolve does
        graph = model_graph(trace(loss, args, {}, (0,)), None)
        return apply_schedule(loss, graph, remat_opt.revolve(
            remat_opt.BaselineCall(loss, args, budget_bytes=1)).schedule)
    raise ValueError(f"unknown strategy {strategy!r}")


def baseline_plan(
    strategy: str, loss: Callable[..., Any], args: tuple[Any, Any], memory: int
) -> remat_opt.Plan:
    """The baseline's own :class:`remat_opt.Plan` (public API) at these arguments."""
    kind, _, policy = strategy.partition("/")
    call = remat_opt.BaselineCall(loss, args, budget_bytes=memory)
    if kind == "no_remat":
        return remat_opt.no_remat(call)
    if kind == "checkpoint":
        return remat_opt.checkpoint_policy(call, policy)
    if kind == "layer_checkpoint":
        return remat_opt.layer_checkpoint_policy(call, policy)
    if kind == "megatron_selective":
        return remat_opt.megatron_selective(call)
    if kind == "chen_sqrt_n":
        return remat_opt.chen_sqrt_n(call)
    if kind == "revolve":
        return remat_opt.revolve(call)
    raise ValueError(f"unknown strategy {strategy!r}")


def program_key(strategy: str) -> str:
    """Strategies that run the same program share their measurements."""
    if strategy == "megatron_selective":
        return "layer_checkpoint/dots_with_no_batch_dims_saveable"
    return strategy


class Searcher:
    """Runs the batch search for every strategy of one model, sharing XLA measurements."""

    def __init__(self, model: Model, memory: int, step: int, options: remat_opt.SolverOptions,
                 log: Callable[[str], None]):
        self.model, self.memory, self.step = model, memory, step
        self.options, self.log = options, log
        self._peaks: dict[tuple[str, int], tuple[int, float]] = {}

    def peak(self, strategy: str, batch: int) -> tuple[int, float]:
        """XLA's peak of a baseline's program at ``batch`` (cached), with the seconds it took."""
        key = (program_key(strategy), batch)
        if key not in self._peaks:
            start = time.perf_counter()
            args = self.model.args(batch)
            program = baseline_program(strategy, self.model.spec.loss, args)
            self._peaks[key] = remat_opt.peak_bytes(program, *args), time.perf_counter() - start
        return self._peaks[key]

    def best_policy(self, kind: str) -> str:
        """``kind/<policy>`` with the lowest peak at the config's batch (ties: POLICIES order)."""
        batch = self.model.config.batch
        peaks = {p: self.peak(f"{kind}/{p}", batch)[0] for p in _policies.POLICIES}
        best = min(peaks, key=peaks.get)
        self.log(f"  {kind}: peaks at batch {batch}: "
                 + ", ".join(f"{p} {v / MiB:.2f} MiB" for p, v in peaks.items()) + f" -> {best}")
        return f"{kind}/{best}"

    def baseline(self, strategy: str) -> Result:
        start = time.perf_counter()
        probes: list[Probe] = []

        def fits(batch: int) -> bool:
            peak, seconds = self.peak(strategy, batch)
            probes.append(Probe(batch, peak <= self.memory, peak, seconds, ""))
            return peak <= self.memory

        best = largest_fitting(fits, self.model.config.batch, self.step)
        plan, note = None, ""
        if best > 0:
            plan = baseline_plan(strategy, self.model.spec.loss, self.model.args(best), self.memory)
            if not plan.fits:
                note = f"public API measured {plan.measured_peak_bytes:,} bytes: over the memory"
        return Result(strategy, best, plan, tuple(probes), time.perf_counter() - start, note)

    def remat_opt(self) -> Result:
        start = time.perf_counter()
        probes: list[Probe] = []
        plans: dict[int, remat_opt.Plan] = {}

        def fits(batch: int) -> bool:
            t = time.perf_counter()
            step = remat_opt.optimize(self.model.spec.loss, self.memory, solver_options=self.options)
            try:
                plan = step.plan(*self.model.args(batch))
            except remat_opt.RematOptError as err:
                # InfeasibleBudgetError's min_budget_bytes: the lowest peak it reached (model or XLA).
                peak = getattr(err, "min_budget_bytes", None)
                message = " ".join(str(err).split())
                probes.append(Probe(batch, False, peak, time.perf_counter() - t,
                                    f"{type(err).__name__}: {message}"))
                return False
            plans[batch] = plan
            probes.append(Probe(batch, bool(plan.fits), plan.measured_peak_bytes,
                                time.perf_counter() - t, f"{plan.status}, {plan.attempts} attempt(s)"))
            return bool(plan.fits)

        best = largest_fitting(fits, self.model.config.batch, self.step)
        failures = sorted({p.note.split(":")[0] for p in probes
                           if not p.fits and not p.note.startswith("InfeasibleBudgetError")})
        note = ("other failures: " + ", ".join(failures)) if failures else ""
        seconds = time.perf_counter() - start
        return Result("remat_opt", best, plans.get(best), tuple(probes), seconds, note)

    def run(self, strategies: tuple[str, ...]) -> list[Result]:
        results = []
        for kind in strategies:
            if kind in ("checkpoint", "layer_checkpoint"):
                strategy = self.best_policy(kind)
            else:
                strategy = kind
            result = self.remat_opt() if kind == "remat_opt" else self.baseline(strategy)
            peak = "—" if result.plan is None else f"{result.plan.measured_peak_bytes / MiB:.2f} MiB"
            self.log(f"  {strategy}: max batch {result.max_batch} (peak {peak}); "
                     f"{len(result.probes)} probes, {result.seconds:.1f} s")
            results.append(result)
        return results


def contradictions(result: Result) -> list[str]:
    """Probes that break the search's monotonicity assumption (a fit above a miss)."""
    misses = [p.batch for p in result.probes if not p.fits]
    hits = [p.batch for p in result.probes if p.fits]
    return [f"batch {b} fits but {m} does not" for b in hits for m in misses if m < b]


# --------------------------------------------------------------------------- output


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | strategy | max batch (step) | vs no_remat | peak at max batch (MiB) | memory (MiB) "
        "| recompute overhead | probes |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        peak = "—" if r["peak_bytes"] in (None, "") else f"{r['peak_bytes'] / MiB:.2f}"
        over = "—" if r["recompute_overhead"] in (None, "") else f"{r['recompute_overhead']:+.1%}"
        ratio = "—" if not r["no_remat_batch"] else f"{r['max_batch'] / r['no_remat_batch']:.2f}x"
        lines.append(f"| {r['model']} | {r['strategy']} | {r['max_batch']} ({r['batch_step']}) | {ratio} "
                     f"| {peak} | {r['memory_bytes'] / MiB:.2f} | {over} | {r['probes']} |")
    return "\n".join(lines)


def bar_chart(rows: list[dict], path: Path, stamp: str) -> None:
    """Grouped bars: per model, each strategy's max batch over no_remat's, labelled with the batch."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    kinds = list(dict.fromkeys(r["strategy_kind"] for r in rows))
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(min(12.0, max(7.5, 2 + 0.4 * len(models) * len(kinds))), 4.5))
    cmap = plt.get_cmap("tab10")
    top = 1.0
    for j, kind in enumerate(kinds):
        xs, heights, labels = [], [], []
        for i, model in enumerate(models):
            row = next((r for r in rows if (r["model"], r["strategy_kind"]) == (model, kind)), None)
            if row is None:
                continue
            xs.append(i + (j - (len(kinds) - 1) / 2) * width)
            heights.append(row["max_batch"] / (row["no_remat_batch"] or 1))
            labels.append(str(row["max_batch"]))
        top = max([top, *heights])
        label = f"{kind} (best JAX policy)" if kind in ("checkpoint", "layer_checkpoint") else kind
        bars = ax.bar(xs, heights, width, label=label, color=cmap(j % 10))
        ax.bar_label(bars, labels, fontsize=7, padding=1)
    memory = {r["model"]: r["memory_bytes"] for r in rows}
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{m}\n(memory {memory[m] / MiB:.2f} MiB)" for m in models])
    ax.set_ylabel("max batch / no_remat's max batch")
    ax.set_ylim(0, top * 1.3)
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_title("Largest batch that fits a fixed memory (bar labels: the batch size)", fontsize=10)
    ax.legend(fontsize=7, ncols=min(3, len(kinds)), loc="upper left")
    stamp = "\n".join(textwrap.wrap(stamp, 160))
    fig.text(0.01, 0.01, stamp, fontsize=6, color="gray", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None,
                        help="zoo models (default: all four; with --quick: mlp, small config)")
    parser.add_argument("--strategies", nargs="+", choices=ALL_STRATEGIES, default=None,
                        help="strategies (default: all; with --quick: no_remat, chen_sqrt_n, remat_opt)")
    parser.add_argument("--memory", default=None,
                        help="fixed memory, bytes or a size like 64MiB (default: per model, XLA's "
                             "plain peak at its config's batch)")
    parser.add_argument("--quick", action="store_true",
                        help="a small MLP config and three strategies: a run of about a minute")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="CP-SAT limit per solve, seconds: a quarter of it in deterministic time, "
                             "ten times it on the wall clock (default: 20; 3 with --quick)")
    parser.add_argument("--batch-step", type=int, default=None,
                        help="search batch sizes in multiples of this (default: an eighth of the config's "
                             "batch when that divides it, else 1)")
    parser.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the CSV and PNG")
    args = parser.parse_args(argv)
    memory_fixed = None
    if args.memory is not None:
        memory_fixed = remat_opt.parse_bytes(args.memory, argument="--memory")

    command = "python experiments/batch_size.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    command = command.strip()
    source = source_version()
    print(f"Reproduce: {command}")
    print(f"jax {jax.__version__}; {machine()}; remat_opt source {source}", flush=True)

    names = args.models or (list(QUICK_MODELS) if args.quick else list(MODELS))
    strategies = tuple(args.strategies or (QUICK_STRATEGIES if args.quick else ALL_STRATEGIES))
    time_limit = args.time_limit if args.time_limit is not None else (3.0 if args.quick else 20.0)
    options = remat_opt.SolverOptions(
        time_limit_s=10 * time_limit, deterministic_time_limit=time_limit / 4, num_workers=args.workers
    )
    stem = "batch_size.quick" if args.quick else "batch_size"

    rows: list[dict] = []
    probe_rows: list[dict] = []
    warnings: list[str] = []
    total = time.perf_counter()
    for name in names:
        spec = MODELS[name]
        config = QUICK_CONFIGS.get(name, spec.default_config) if args.quick else spec.default_config
        model = Model(name, spec, config)
        memory = memory_fixed or remat_opt.peak_bytes(spec.loss, *model.args(config.batch))
        print(f"\n{name}: {config}; memory {memory / MiB:.2f} MiB"
              + ("" if memory_fixed else f" (plain peak at batch {config.batch})"), flush=True)
        step = batch_step(config, args.batch_step)
        searcher = Searcher(model, memory, step, options, lambda s: print(s, flush=True))
        results = searcher.run(strategies)
        no_remat = next((r.max_batch for r in results if r.strategy == "no_remat"), None)
        for r in results:
            for c in contradictions(r):
                warnings.append(f"{name} {r.strategy}: not monotone: {c}")
            if r.note:
                warnings.append(f"{name} {r.strategy}: {r.note}")
            plan = r.plan
            rows.append({
                "model": name,
                "strategy": r.strategy,
                "strategy_kind": r.strategy.split("/")[0] if "/" in r.strategy else r.strategy,
                "max_batch": r.max_batch,
                "batch_step": step,
                "no_remat_batch": no_remat,
                "peak_bytes": None if plan is None else plan.measured_peak_bytes,
                "memory_bytes": memory,
                "fits": None if plan is None else plan.fits,
                "recompute_overhead": (
                    None if plan is None or plan.measured_recompute_flops is None
                    else plan.measured_recompute_flops / plan.baseline_flops
                ),
                "status": None if plan is None else plan.status,
                "probes": len(r.probes),
                "seconds": round(r.seconds, 2),
                "note": r.note,
                "config": repr(config),
            })
            probe_rows += [{"model": name, "strategy": r.strategy, **p._asdict()} for p in r.probes]
    seconds = time.perf_counter() - total

    print()
    print(markdown(rows))
    print()
    print("max batch: the largest batch (a multiple of the model's batch step) whose gradient step XLA "
          "measures within the memory, by doubling then bisection. Peak and recompute overhead (FLOPs on "
          "the jaxpr beyond the plain gradient's) are those of the strategy's plan at that batch.")
    for w in warnings:
        print(f"WARNING: {w}")
    print(f"total {seconds:.0f} s")

    stamp = {"jax_version": jax.__version__, "machine": machine(), "source": source, "command": command}
    args.out.mkdir(parents=True, exist_ok=True)
    tables = ((args.out / f"{stem}.csv", rows), (args.out / f"{stem}.probes.csv", probe_rows))
    for path, table in tables:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[*table[0], *stamp])
            writer.writeheader()
            for r in table:
                writer.writerow({**r, **stamp})
        print(f"wrote {path}")
    png = args.out / f"{stem}.png"
    bar_chart(rows, png, f"jax {jax.__version__}; {platform.platform()}; remat_opt {source}; {command}")
    print(f"wrote {png}")
    remat = {r["model"]: r["max_batch"] for r in rows if r["strategy"] == "remat_opt"}
    beaten = [r for r in rows if r["model"] in remat and r["max_batch"] > remat[r["model"]]]
    for r in beaten:
        print(f"NOTE: {r['model']}: {r['strategy']} fits batch {r['max_batch']} "
              f"> remat_opt's {remat[r['model']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
