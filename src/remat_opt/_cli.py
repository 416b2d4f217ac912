"""The command line: ``remat-opt peak``, ``remat-opt plan``, ``remat-opt demo``, ``remat-opt cache``.

Installed as the ``remat-opt`` console script; ``python -m remat_opt`` is the
same. Exit codes follow the usual convention: 0 on success, 2 on a usage error
(argparse's, and a ``MODULE:NAME`` that cannot be imported), 1 when remat_opt
raises one of its errors (the message goes to stderr) or the demo misses a
budget or a gradient; 141 when the reader of stdout left early (``| head``), as for a process
ended by SIGPIPE, without a traceback. ``--json`` output is one JSON document on stdout.

Example::

    remat-opt peak mypkg.train:loss --args mypkg.train:example_args
    remat-opt plan mypkg.train:loss --args mypkg.train:example_args --budget 2GiB --report
    remat-opt plan mypkg.train:loss --args mypkg.train:example_args --budget 0.6x
    remat-opt cache list --json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .cache import _cache
from ._budget import format_bytes, parse_bytes
from ._errors import InvalidBudgetError, InvalidBudgetTypeError, RematOptError
from ._api import optimize
from .planner._floor import floor_of
from .planner._progress import ENV
from ._plan import Plan
from .memory._measure import peak_bytes, traced_step


@dataclasses.dataclass(frozen=True)
class Relative:
    """A budget given as a share of the plain step's peak (``0.6x``)."""

    fraction: float

    def of(self, plain_peak: int) -> int:
        return int(plain_peak * self.fraction)


def _budget(text: str) -> int | Relative:
    """``--budget``: bytes (``2GiB``, ``500000000``), or a share of the plain peak (``0.6x``)."""
    if text.strip().lower().endswith("x"):
        try:
            fraction = float(text.strip()[:-1])
        except ValueError:
            fraction = float("nan")
        if not 0 < fraction < float("inf"):
            raise argparse.ArgumentTypeError(f"--budget as a share of the plain peak must be a positive number "
                                             f"followed by x, such as 0.6x; got {text!r}.")
        return Relative(fraction)
    try:
        return parse_bytes(text, argument="--budget")
    except (InvalidBudgetError, InvalidBudgetTypeError) as err:
        raise argparse.ArgumentTypeError(f"{err} Or give a share of the plain peak, such as 0.6x.") from err


def _argnums(text: str) -> int | tuple[int, ...]:
    try:
        nums = tuple(int(n) for n in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"--argnums must be an int or ints separated by commas; got {text!r}.") from err
    return nums[0] if len(nums) == 1 else nums


def _reference(text: str) -> tuple[str, str]:
    module, sep, name = text.partition(":")
    if not sep or not module or not name:
        raise argparse.ArgumentTypeError(f"expected MODULE:NAME (e.g. mypkg.train:loss); got {text!r}.")
    return module, name


def _load(parser: argparse.ArgumentParser, reference: tuple[str, str], what: str) -> Callable[..., Any]:
    """The object ``MODULE:NAME`` names, importing from the working directory too
    (as ``python -m`` does); a usage error when it cannot be found."""
    module_name, name = reference
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        parser.error(f"{what}: cannot import module {module_name!r} ({err}).")
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            parser.error(f"{what}: module {module_name!r} has no attribute {name!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        parser.error(f"{what}: {module_name}:{name} is not callable (a {type(obj).__name__}).")
    return obj


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan's figures and decisions as JSON-ready data (no graph)."""
    out = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)
           if f.name not in ("graph", "schedule", "loop_plan")}
    out["segment_peaks"] = list(plan.segment_peaks)
    out["schedule"] = None if plan.schedule is None else json.loads(plan.schedule.to_json())
    out["loop_plan"] = None if plan.loop_plan is None else dataclasses.asdict(plan.loop_plan)
    out.update(num_segments=plan.num_segments, recompute_overhead=plan.recompute_overhead, fits=plan.fits)
    return out


def _program(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Callable[..., Any], tuple]:
    """The function and the positional arguments ``MODULE:FUNCTION --args MODULE:FACTORY`` name."""
    fn = _load(parser, args.function, "FUNCTION")
    factory = _load(parser, args.args, "--args")
    call_args = factory()
    if not isinstance(call_args, (tuple, list)):
        parser.error(f"--args: {args.args[0]}:{args.args[1]}() must return a tuple of positional arguments; "
                     f"got a {type(call_args).__name__}.")
    return fn, tuple(call_args)


def _plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    fn, call_args = _program(parser, args)
    cache: bool | str = False if args.no_cache else (args.cache_dir or True)
    budget = args.budget
    if isinstance(budget, Relative):
        plain = peak_bytes(fn, *call_args, argnums=args.argnums, has_aux=args.has_aux)
        budget = budget.of(plain)
        print(f"budget {args.budget.fraction:g}x of the plain peak {format_bytes(plain)}: {format_bytes(budget)} "
              f"({budget:,} bytes)", file=sys.stderr)
    step = optimize(fn, budget, argnums=args.argnums, has_aux=args.has_aux, cache=cache)
    plan = step.plan(*call_args)
    if args.json:
        print(json.dumps(plan_json(plan), indent=1))
    else:
        print(plan.report() if args.report else plan)
    return 0


def _peak(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The plain step's peak, the figure a budget is chosen against, and the floor under every plan."""
    fn, call_args = _program(parser, args)
    plain = peak_bytes(fn, *call_args, argnums=args.argnums, has_aux=args.has_aux)
    floor = floor_of(traced_step(fn, call_args, {}, args.argnums, args.has_aux).jaxpr.jaxpr).total
    if args.json:
        print(json.dumps({"plain_peak_bytes": plain, "arguments_and_outputs_bytes": floor}, indent=1))
        return 0
    print(f"plain gradient step peak (XLA): {format_bytes(plain)} ({plain:,} bytes)")
    print(f"its arguments and outputs (no plan goes under them): {format_bytes(floor)} ({floor:,} bytes)")
    print(f"e.g. remat-opt plan ... --budget 0.6x  (a budget of {format_bytes(int(plain * 0.6))})")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run

    fractions = tuple(float(f) for f in args.fractions.split(","))
    rows = run(args.model, fractions)
    return 0 if rows and all(r["ok"] for r in rows) else 1


def _cache_command(args: argparse.Namespace) -> int:
    directory = _cache.cache_directory(args.dir or True)
    assert directory is not None  # on: the default folder, or the one given
    if args.action == "clear":
        removed = _cache.clear(directory)
        print(f"removed {removed} cached plan(s) from {directory}")
        return 0
    rows = _cache.list_entries(directory)
    if args.json:
        print(json.dumps({"directory": str(directory), "entries": rows}, indent=1))
        return 0
    print(f"{len(rows)} cached plan(s) in {directory}")
    for r in rows:
        figures = ""
        if r.get("kind") == "refused" and r.get("budget_bytes") is not None:
            figures = f"budget {format_bytes(r['budget_bytes'])} refused, lowest {format_bytes(r['min_budget_bytes'])}"
        elif r.get("budget_bytes") is not None and r.get("measured_peak_bytes") is not None:
            figures = (f"budget {format_bytes(r['budget_bytes'])}, measured {format_bytes(r['measured_peak_bytes'])}, "
                       f"{r.get('status')}")
        print(f"{r['key'][:12]}  {r.get('created') or '?':24} {r.get('kind') or '?':8} {r.get('function') or '?'}  "
              f"{figures}  [{r['valid']}]")
    return 0


def _show_progress(show: bool) -> None:
    """Progress while planning (remat_opt.planner._progress): off with ``--quiet``; where stderr is no
    terminal, as log lines on stderr."""
    if not show:
        os.environ[ENV] = "0"
        return
    progress_logger = logging.getLogger("remat_opt.progress")
    if not sys.stderr.isatty() and not progress_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        progress_logger.addHandler(handler)
        progress_logger.setLevel(logging.INFO)


def parser() -> argparse.ArgumentParser:
    """The ``remat-opt`` argument parser."""
    from .zoo import MODELS

    top = argparse.ArgumentParser(prog="remat-opt", description="Gradient-checkpoint placement for JAX: plan a "
                                  "function under a memory budget, run the demo, manage the plan cache.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def program_arguments(command: argparse.ArgumentParser) -> None:
        command.add_argument("function", type=_reference, metavar="MODULE:FUNCTION", help="the loss function")
        command.add_argument("--args", required=True, type=_reference, metavar="MODULE:FACTORY",
                             help="a function of no arguments returning the tuple of positional arguments")
        command.add_argument("--argnums", type=_argnums, default=0,
                             help="differentiated arguments, e.g. 0 or 0,1 (default 0)")
        command.add_argument("--has-aux", action="store_true", help="FUNCTION returns (loss, aux)")

    peak = sub.add_parser("peak", help="XLA's peak for a function's plain gradient step (to choose a budget)",
                          description="Print XLA's peak for one step of jax.jit(jax.value_and_grad(FUNCTION)) on "
                          "the arguments the --args factory returns, and the bytes of its arguments and "
                          "outputs, under which no plan goes.")
    program_arguments(peak)
    peak.add_argument("--json", action="store_true", help="print the figures as JSON")

    plan = sub.add_parser("plan", help="plan a function of yours under a budget",
                          description="Plan MODULE:FUNCTION's gradient step under --budget, on the arguments "
                          "the --args factory returns, and print the plan (kept in the plan cache).")
    program_arguments(plan)
    plan.add_argument("--budget", required=True, type=_budget,
                      help='peak bytes of the step, e.g. "2GiB" or 500000000, or a share of the plain peak '
                      '(remat-opt peak), e.g. 0.6x')
    plan.add_argument("--json", action="store_true", help="print the plan's figures and decisions as JSON")
    plan.add_argument("-q", "--quiet", action="store_true", help="show no progress while planning")
    plan.add_argument("--report", action="store_true", help="print the table per segment (Plan.report)")
    where = plan.add_mutually_exclusive_group()
    where.add_argument("--cache-dir", help=f"plan cache folder (default ${_cache.CACHE_DIR_ENV} or ~/.cache/remat_opt)")
    where.add_argument("--no-cache", action="store_true", help="neither load nor keep the plan")

    demo = sub.add_parser("demo", help="optimize an embedded model at several budgets",
                          description="Optimize an embedded zoo model at budgets given as fractions of its plain "
                          "peak, and check each plan's gradients against jax.grad; exit 1 if XLA measures "
                          "any plan over its budget or a gradient differs.")
    demo.add_argument("--model", default="gpt", choices=sorted(MODELS))
    demo.add_argument("--fractions", default="0.9,0.75,0.6,0.5,0.4",
                      help="budgets as fractions of the plain peak, comma-separated")
    demo.add_argument("-q", "--quiet", action="store_true", help="show no progress while planning")

    cache = sub.add_parser("cache", help="list or clear the plan cache",
                           description="List the cached plans, or delete them all.")
    cache.add_argument("action", choices=("list", "clear"))
    cache.add_argument("--json", action="store_true", help="list as JSON")
    cache.add_argument("--dir", help=f"the cache folder (default ${_cache.CACHE_DIR_ENV} or ~/.cache/remat_opt)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``remat-opt``; returns the exit code."""
    top = parser()
    args = top.parse_args(argv)
    _show_progress(not getattr(args, "quiet", False))
    try:
        if args.command == "plan":
            return _plan(top, args)
        if args.command == "peak":
            return _peak(top, args)
        if args.command == "demo":
            return _demo(args)
        return _cache_command(args)
    except RematOptError as err:
        print(f"remat-opt: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader left (`remat-opt cache list --json | head`): the rest is not wanted
        # stdout goes nowhere from here, so the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as a shell reports a process ended by SIGPIPE
