"""The persistent plan cache: a plan made once is loaded by every later process.

Someone training a model plans the same program on every restart, sweep job and
host. A plan depends only on the program, its argument shapes (and, on a mesh,
their shardings and the interconnect), the budget, ``optimize``'s options, the
device and the versions of jax and remat_opt, so it is kept on disk under a key
made of them (the program as its jaxpr's text, and, where a custom derivative
rule is Python code that text only names, the gradient step's text too), as
JSON: the plan's figures and its decisions (:meth:`remat_opt.Schedule.to_json`,
or the loop plan), never pickled code. A process that finds the entry rebuilds the graph (trace and build, no
compile) and the rewritten program from the decisions, and makes no solver
call and compiles no candidate (:meth:`remat_opt.OptimizedFunction` does that).
A cost model is part of the key by its type and, for a dataclass, its fields;
one that is not a dataclass cannot be told from another of its type, so its
plans are neither read nor kept (:func:`names_cost_model`).

The folder is ``optimize(..., cache=path)``, else the environment variable
``REMAT_OPT_CACHE_DIR``, else ``~/.cache/remat_opt``; ``cache=False`` turns it
off. One file per key, ``<sha256>.json``, written to a temporary file in the
same folder and moved into place (``os.replace``), so that processes planning
at once each leave a whole entry and a reader never sees half of one.

The file name hashes what the plan is *for*; the versions it was made *with*
(jax, jaxlib, remat_opt and a digest of remat_opt's own source) are checked
inside the entry. So an entry made by another version is found, reported as
stale and replaced, rather than left on disk forever. A corrupt or stale entry
is reported once (:class:`CacheWarning`) and planned again, never trusted.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
from jax.extend import core

from .._errors import InfeasibleBudgetError
from .._options import PlanOptions
from .._plan import Plan, Timed
from .._schedule import Schedule
from ..memory._measure import traced_step
from ..memory._sharded import Collective, is_sharded
from ..program._static import mesh_sharding, split
from ..program._trace import TracedProgram
from ..rewrite._layers import LayerPlan
from ..rewrite._loops import LoopPlan

CACHE_DIR_ENV = "REMAT_OPT_CACHE_DIR"
FORMAT = 1
KINDS = ("plain", "schedule", "loop", "policy", "layers", "lowest", "refused", "front")
"""What an entry restores: the function as written, a schedule on the traced
program, a loop plan on the program with its scans whole, or ``jax.checkpoint``
around the whole function with a built-in policy; or, under the program's key
for any budget, the lowest-memory schedule XLA measured (:mod:`remat_opt.cache._lowest`);
or the :class:`remat_opt.InfeasibleBudgetError` a budget was refused with (a refusal
costs a search as a plan does, and the same program at the same budget is refused again)."""

_PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(Plan)
                     if f.name not in ("graph", "schedule", "loop_plan", "layer_plan", "timed"))


class CacheWarning(UserWarning):
    """A cached plan could not be used (unreadable, or made by other versions)
    or not be written; remat_opt planned again. Reported once per entry."""


class CacheEntryError(ValueError):
    """An entry that cannot be trusted: the reason, for :class:`CacheWarning`."""


def cache_directory(setting: bool | str | os.PathLike) -> Path | None:
    """The folder of ``optimize(..., cache=setting)``; ``None`` when it is off.

    Args:
        setting: ``True`` for ``$REMAT_OPT_CACHE_DIR`` or else
            ``~/.cache/remat_opt`` (read at each call), ``False`` for no cache,
            or a folder.
    """
    if setting is False:
        return None
    if setting is True:
        return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "remat_opt").expanduser()
    return Path(setting).expanduser()


@functools.cache
def versions() -> dict[str, str]:
    """What an entry must have been made with to be trusted."""
    package = Path(__file__).parent.parent  # all of remat_opt, not only this subpackage
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):  # any change to remat_opt's code may change a plan
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    try:
        remat_opt = importlib.metadata.version("remat_opt")
    except importlib.metadata.PackageNotFoundError:
        remat_opt = "unknown"
    return {"format": str(FORMAT), "remat_opt": remat_opt, "code": digest.hexdigest()[:16],
            "jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib")}


def names_cost_model(cost_model: Any) -> bool:
    """Whether :func:`options_of` names ``cost_model`` fully: the default, or a
    dataclass (by its fields); another is named by its type alone."""
    return cost_model is None or dataclasses.is_dataclass(cost_model)


def options_of(options: PlanOptions, argnums: tuple[int, ...], constants: Mapping[str, Any]) -> dict[str, Any]:
    """The options a plan depends on: ``optimize``'s (``argnums`` normalized) and the
    search's ``constants`` (the planner's upper-case class attributes, such as ``RETRY_MARGIN``)."""
    cost_model = options.cost_model
    model = "default" if cost_model is None else f"{type(cost_model).__module__}.{type(cost_model).__qualname__}"
    if cost_model is not None and names_cost_model(cost_model):
        model += repr(cost_model)
    return {
        "solver_options": dataclasses.asdict(options.solver),
        "max_attempts": options.max_attempts,
        "unroll_scans": options.unroll_scans,
        "compute_saved_once": options.compute_saved_once,
        "xla_facts": options.xla_facts,
        "has_aux": options.has_aux,
        "argnums": list(argnums),
        "objective": "time" if options.minimises_time() else "flops",
        "cost_model": model,
        "search": dict(constants),
    }


def layout_of(args: tuple, kwargs: dict, interconnect: Any) -> dict[str, Any] | None:
    """What a plan on a mesh is also for: each argument leaf's sharding (its
    mesh's axes and sizes, its partition spec) and the interconnect that priced
    the collectives; ``None`` for arguments on one device."""
    if not is_sharded(args, kwargs):
        return None
    leaves, _ = split((args, kwargs))
    return {"shardings": [str(mesh_sharding(x)) for x in leaves], "interconnect": repr(interconnect)}


def _hides_code(jaxpr: core.Jaxpr) -> bool:
    """Whether some equation carries Python code its text does not show: a parameter that is a
    function, not a jaxpr (a ``custom_vjp``'s backward, a ``custom_jvp``'s rule)."""
    for eqn in jaxpr.eqns:
        if any(callable(v) and not isinstance(v, (core.Jaxpr, core.ClosedJaxpr)) for v in eqn.params.values()):
            return True
        if any(_hides_code(sub) for sub in core.jaxprs_in_params(eqn.params)):
            return True
    return False


def derivative_text(program: TracedProgram, fn: Callable[..., Any], args: tuple, kwargs: dict,
                    argnums: Any, has_aux: bool) -> str | None:
    """What the program's text leaves out of its gradient, for :func:`plan_key`: the text of
    the traced gradient step where a custom derivative rule is Python code (edit a
    ``custom_vjp``'s backward, and the key changes); ``None`` where the text shows it all."""
    if not _hides_code(program.jaxpr.jaxpr):
        return None
    return str(traced_step(fn, args, kwargs, argnums, has_aux).jaxpr)


def plan_key(program: TracedProgram, budget_bytes: int | None, options: Mapping[str, Any],
             layout: Mapping[str, Any] | None = None, derivatives: str | None = None) -> str:
    """The sha256 of what a plan is for.

    Args:
        program: the function traced with its scans whole
            (:func:`remat_opt.program._trace.trace`); its jaxpr's text is
            deterministic, with static leaves and literals in it.
        budget_bytes: the budget; ``None`` for what holds of the program at any budget.
        options: :func:`options_of`.
        layout: :func:`layout_of`, for arguments on a mesh.
        derivatives: :func:`derivative_text`, where the program has custom rules.
    """
    jaxpr = program.jaxpr
    material = {
        "program": re.sub(r" at 0x[0-9a-f]+", "", str(jaxpr)),  # no object addresses, should any print
        "inputs": [str(v.aval) for v in jaxpr.jaxpr.invars],
        "in_tree": str(program.in_tree),
        "out_tree": str(program.out_tree),
        "differentiable": list(program.differentiable),
        "budget_bytes": budget_bytes,
        "options": options,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # scheduler flags move peaks
    }
    if layout is not None:  # (absent on one device: the keys of entries made before stay as they were)
        material["layout"] = layout
    if derivatives is not None:
        material["derivatives"] = re.sub(r" at 0x[0-9a-f]+", "", derivatives)
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def plan_kind(plan: Plan) -> str | None:
    """The :data:`KINDS` entry that restores ``plan``; ``None`` for a plan that
    cannot be restored from its decisions (a baseline's JAX policy)."""
    if plan.strategy != "remat_opt" or plan.schedule is None:
        return None
    if plan.loop_plan is not None:
        return "loop"
    if plan.layer_plan is not None:
        return "layers"
    if plan.whole_policy is not None:
        return "policy"
    return "plain" if plan.status == "PLAIN" else "schedule"


def plan_entry(plan: Plan, kind: str, function: str) -> dict[str, Any]:
    """The JSON-ready entry for ``plan`` (of kind ``kind``, see :func:`plan_kind`)."""
    if plan.schedule is None:
        raise ValueError("a plan without a schedule has no cache entry (see plan_kind).")
    figures = {name: getattr(plan, name) for name in _PLAN_FIELDS}
    figures["collectives"] = [dataclasses.asdict(c) for c in plan.collectives]
    loop = None if plan.loop_plan is None else {"policy": plan.loop_plan.policy, "chunks": plan.loop_plan.chunks,
                                                "saved": plan.loop_plan.saved, "body": plan.loop_plan.body,
                                                "names": plan.loop_plan.names}
    layers = None if plan.layer_plan is None else {
        "bounds": list(plan.layer_plan.bounds), "fenced": plan.layer_plan.fenced,
        "policies": [list(p) if isinstance(p, tuple) else p for p in plan.layer_plan.policies],
        "groups": [list(g) for g in plan.layer_plan.groups]}
    return {"versions": versions(), "kind": kind, "function": function,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "plan": figures,
            "schedule": json.loads(plan.schedule.to_json()), "loop_plan": loop, "layer_plan": layers,
            "timed": [dataclasses.asdict(t) for t in plan.timed]}


def refusal_entry(err: InfeasibleBudgetError, function: str) -> dict[str, Any]:
    """The JSON-ready entry for a refused budget: the error's figures and its lowest-memory schedule."""
    return {"versions": versions(), "kind": "refused", "function": function,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "plan": {"budget_bytes": err.budget_bytes, "min_budget_bytes": err.min_budget_bytes,
                     "detail": err.detail, "lower_bound": err.lower_bound},
            "schedule": None if err.schedule is None else json.loads(err.schedule.to_json()), "loop_plan": None}


def entry_refusal(entry: Mapping[str, Any], path: Path) -> InfeasibleBudgetError:
    """The error a ``"refused"`` entry (at ``path``) keeps, saying where it was remembered.

    Raises:
        CacheEntryError: a figure is missing or of the wrong kind.
    """
    stored = entry["plan"]
    try:
        budget, lowest = int(stored["budget_bytes"]), int(stored["min_budget_bytes"])
        detail, lower_bound = str(stored["detail"]), bool(stored["lower_bound"])
        schedule = None if entry["schedule"] is None else entry_schedule(entry)
    except (KeyError, TypeError, ValueError) as err:
        raise CacheEntryError(f"holds a refusal that does not read back ({err})") from err
    remembered = f"(Refused before and remembered by the plan cache, {path}; `remat-opt cache clear` forgets it.)"
    return InfeasibleBudgetError(budget, lowest, detail=f"{detail} {remembered}".strip(), schedule=schedule,
                                 lower_bound=lower_bound)


def entry_schedule(entry: Mapping[str, Any]) -> Schedule:
    """The entry's schedule."""
    return Schedule.from_json(json.dumps(entry["schedule"]))


def entry_loop_plan(entry: Mapping[str, Any]) -> LoopPlan | None:
    """The entry's loop plan, if it is one."""
    loop = entry["loop_plan"]
    if loop is None:
        return None
    saved = loop.get("saved")
    names = loop.get("names")
    return LoopPlan(loop["policy"], int(loop["chunks"]), None if saved is None else tuple(saved),
                    loop.get("body", "scan"), None if names is None else tuple(names))


def entry_layer_plan(entry: Mapping[str, Any]) -> LayerPlan | None:
    """The entry's layer plan, if it is one (entries written before layer plans have none)."""
    layers = entry.get("layer_plan")
    if layers is None:
        return None
    policies = tuple(tuple(p) if isinstance(p, list) else p for p in layers["policies"])
    groups = tuple((int(first), int(end)) for first, end in layers.get("groups", ()))
    return LayerPlan(tuple(int(b) for b in layers["bounds"]), policies, bool(layers["fenced"]), groups)


def plan_from_entry(entry: Mapping[str, Any], graph: Any) -> Plan:
    """The cached plan, with ``graph`` (the annotated networkx graph, rebuilt).

    Raises:
        CacheEntryError: a figure is missing or of the wrong kind.
    """
    stored = entry["plan"]
    if set(stored) != set(_PLAN_FIELDS):
        raise CacheEntryError(f"its plan has fields {sorted(stored)}, this remat_opt's Plan {sorted(_PLAN_FIELDS)}")
    figures: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
    try:
        figures["collectives"] = tuple(Collective(**{**c, "kinds": tuple(c["kinds"])}) for c in figures["collectives"])
    except (TypeError, KeyError) as err:
        raise CacheEntryError(f"holds collectives that do not read back ({err})") from err
    try:
        timed = tuple(Timed(**t) for t in entry.get("timed", ()))
    except TypeError as err:
        raise CacheEntryError(f"holds step times that do not read back ({err})") from err
    return Plan(graph=graph, schedule=entry_schedule(entry), loop_plan=entry_loop_plan(entry),
                layer_plan=entry_layer_plan(entry), timed=timed, **figures)


def entry_path(directory: Path, key: str) -> Path:
    return directory / f"{key}.json"


def _entry_files(directory: Path) -> list[Path]:
    """The entry files of ``directory`` (not the temporary files of a write under way)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))


_reported: set[tuple[str, str]] = set()


def report(path: Path, problem: str) -> None:
    """Warns (:class:`CacheWarning`) about ``path``, once per path and problem."""
    if (str(path), problem) not in _reported:
        _reported.add((str(path), problem))
        warnings.warn(CacheWarning(f"remat_opt plan cache: {path} {problem}"), stacklevel=4)


def check_entry(entry: Any, key: str | None = None) -> None:
    """Raises :class:`CacheEntryError` unless ``entry`` is whole and made by these versions."""
    if not isinstance(entry, dict) or not {"versions", "kind", "plan", "schedule", "loop_plan"} <= set(entry):
        raise CacheEntryError("is not a remat_opt plan entry")
    if key is not None and entry.get("key") != key:
        raise CacheEntryError(f"holds the plan of another key ({str(entry.get('key'))[:12]}...)")
    if entry["versions"] != versions():
        made, now = entry["versions"], versions()
        differ = ", ".join(f"{k} {made.get(k)} (now {now[k]})" for k in now if made.get(k) != now[k])
        raise CacheEntryError(f"is stale: made with {differ}")
    if entry["kind"] not in KINDS:
        raise CacheEntryError(f"has an unknown kind {entry['kind']!r}")


def read_entry(directory: Path, key: str) -> dict[str, Any] | None:
    """The trusted entry for ``key``, or ``None`` (missing, or reported as
    corrupt or stale: then the caller plans again and overwrites it)."""
    path = entry_path(directory, key)
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        check_entry(entry, key)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        report(path, f"cannot be read ({type(err).__name__}: {err}); planning again.")
        return None
    except CacheEntryError as err:
        report(path, f"{err}; planning again.")
        return None
    return entry


def write_entry(directory: Path, key: str, entry: dict[str, Any]) -> None:
    """Writes ``entry`` for ``key`` atomically: a temporary file in ``directory``,
    then ``os.replace``. A folder that cannot be written is reported, not raised."""
    text = json.dumps({**entry, "key": key}, indent=1, sort_keys=True)
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, prefix=".tmp-",
                                         suffix=".json", delete=False) as f:
            tmp = f.name
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, entry_path(directory, key))
    except OSError as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        report(directory, f"cannot be written ({err}); the plan is not kept.")


def list_entries(directory: Path) -> list[dict[str, Any]]:
    """One summary per entry file in ``directory``, newest first: ``key``,
    ``function``, ``kind``, ``created``, the plan's budget, peaks and status,
    ``bytes`` of the file and ``valid`` ("ok", or why it would be planned again)."""
    rows = []
    for path in _entry_files(directory):
        row: dict[str, Any] = {"key": path.stem, "path": str(path), "bytes": path.stat().st_size}
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            check_entry(entry, path.stem)
            row["valid"] = "ok"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            rows.append({**row, "valid": f"unreadable: {type(err).__name__}"})
            continue
        except CacheEntryError as err:
            row["valid"] = str(err)
        plan = entry.get("plan") if isinstance(entry, dict) else None
        plan = plan if isinstance(plan, dict) else {}
        row.update({k: entry.get(k) for k in ("function", "kind", "created")})
        row.update({k: plan.get(k) for k in ("budget_bytes", "measured_peak_bytes", "plain_peak_bytes", "status",
                                             "recompute_flops", "jax_version", "min_budget_bytes")})
        rows.append(row)
    return sorted(rows, key=lambda r: str(r.get("created")), reverse=True)


def clear(directory: Path) -> int:
    """Deletes every entry (and leftover temporary file, and the programs' fronts) in ``directory``;
    returns how many entries there were."""
    entries = _entry_files(directory)
    fronts = directory / "fronts"  # remat_opt.cache._front.FOLDER: each program's measured front
    for path in [*entries, *(directory.glob(".tmp-*.json") if directory.is_dir() else ()),
                 *(fronts.glob("*.json") if fronts.is_dir() else ())]:
        path.unlink(missing_ok=True)
    return len(entries)


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a planned function, as an entry names it."""
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', type(fn).__name__)}"
