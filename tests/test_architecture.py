"""The package's architecture, read from its source with ``ast`` (nothing is imported but
remat_opt itself, to find its folder):

- private JAX (``jax._src``) is imported by one module, :mod:`remat_opt._jax_private`, which
  says per name why it is needed;
- the import graph of remat_opt's modules, module-level, function-level and
  ``TYPE_CHECKING`` imports alike, has no cycle;
- every module is in a layer: a subpackage, or a top-level module of :data:`CORE`, :data:`PLAN`
  or :data:`FACE`;
- imports run down the layers, never up (the contract is :data:`MAY_IMPORT`);
- docstrings and comments hold no measured percentage (:data:`KEPT_PERCENTAGES` are not
  measurements): they state the contract and a one-line why, and docs/measurements.md holds
  the figures (issue 51).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

import remat_opt

PACKAGE = Path(remat_opt.__file__).resolve().parent
PRIVATE_MODULE = "remat_opt._jax_private"

# The floor: types and helpers every layer uses, importing nothing above themselves.
CORE = {"_jax_private", "_units", "_errors", "_budget", "_schedule", "_kept"}
# What is asked and what is answered: the options and the checks of a call's inputs, a plan and
# its report. Above the pipeline (a plan carries its results), below the cache and the planner.
PLAN = {"_options", "_inputs", "_plan", "_report"}
# The package's face: the entry points (``optimize``, ``peak_bytes``, ``optimize_step``), the
# command line and the demo. Nothing imports them but each other.
FACE = {"__init__", "__main__", "_api", "_step", "_cli", "_demo"}
SUBPACKAGES = ("program", "memory", "solve", "rewrite", "baselines", "zoo", "cache", "planner")

MAY_IMPORT = {
    "core": set(),
    "program": {"core"},
    "memory": {"core", "program"},
    "solve": {"core", "program", "memory"},
    "rewrite": {"core", "program", "memory"},
    "plan": {"core", "program", "memory", "solve", "rewrite"},
    "baselines": {"core", "program", "memory", "solve", "rewrite", "plan"},
    # The cache keeps and rebuilds decisions: it needs the stages a plan is rebuilt with and the
    # plan, never the solver (a loaded plan makes no solver call) and never the planner. The
    # planner imports the cache, not the reverse: a search asks the cache first, keeps what it
    # measured there (the lowest schedule, the front, the FLOP counts) and reads its key; the
    # cache is handed the search as a function (cache._restore.cached_or_new_plan), so it needs
    # nothing of the planner, and the other way round would be a cycle.
    "cache": {"core", "program", "memory", "rewrite", "plan"},
    "planner": {"core", "program", "memory", "solve", "rewrite", "plan", "cache"},
    "zoo": set(),
    "face": {"core", "program", "memory", "solve", "rewrite", "plan", "baselines", "cache", "planner", "zoo"},
}
"""Per layer, the layers its modules may import from (besides their own subpackage).
``solve`` and ``rewrite`` are siblings: neither imports the other; so are ``baselines`` and the
``cache``."""


def layer(module: str) -> str:
    """The layer of one of remat_opt's modules; ``"unplaced"`` for a top-level module no set names."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in SUBPACKAGES:
        return parts[1]
    name = parts[1] if len(parts) == 2 else "__init__"
    for room, names in (("core", CORE), ("plan", PLAN), ("face", FACE)):
        if name in names:
            return room
    return "unplaced"


def _module_name(path: Path) -> str:
    parts = ["remat_opt", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> Iterator[tuple[str, int]]:
    """Every module ``module`` imports, anywhere in its source (module level, in functions,
    under ``TYPE_CHECKING``), with the line: ``from P import x`` counts as importing ``P.x``
    where that is a module of remat_opt, else ``P``."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else (node.module or "")
            for alias in node.names:
                yield (f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base), node.lineno


def import_graph() -> nx.DiGraph:
    """remat_opt's modules, an edge per import of one by another (``line``: where)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module in MODULES:
        for target, line in imports(module):
            if target in MODULES and target != module:
                graph.add_edge(module, target, line=line)
    return graph


def _edge(graph: nx.DiGraph, a: str, b: str) -> str:
    return f"{a} -> {b} (line {graph.edges[a, b]['line']})"


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert graph.number_of_edges() > 200
    assert graph.has_edge("remat_opt._plan", "remat_opt._report")  # from . import _report
    assert graph.has_edge("remat_opt.memory._facts", "remat_opt.program._graph")  # from ..program._graph import
    assert graph.has_edge("remat_opt._cli", "remat_opt.zoo")  # in a function
    assert graph.has_edge("remat_opt", "remat_opt._api")
    assert graph.has_edge("remat_opt.planner._flop_search", "remat_opt.cache._front")  # from ..cache import _front


def test_only_one_module_imports_private_jax():
    private = {f"{module}:{line} imports {target}" for module in MODULES for target, line in imports(module)
               if (target == "jax._src" or target.startswith("jax._src.")) and module != PRIVATE_MODULE}
    assert not private, f"import private JAX through {PRIVATE_MODULE} only:\n" + "\n".join(sorted(private))


def around_the_faces(root: Path) -> Iterator[str]:
    """Every ``from remat_opt.P._m import names`` under ``root`` (and its folders, experiments/lab/
    among them) whose names P's face exports."""
    import importlib

    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").count(".") == 2):
                continue
            package, private = node.module.rsplit(".", 1)
            if not (package.split(".")[0] == "remat_opt" and private.startswith("_")):
                continue
            face = set(getattr(importlib.import_module(package), "__all__", ()))
            if all(a.name in face and a.asname is None for a in node.names):
                yield (f"{path.relative_to(root)}:{node.lineno}: from {node.module} import ... "
                       f"(from {package} import ...)")


def test_tests_and_experiments_import_what_a_face_exports_from_the_face():
    root = PACKAGE.parents[1]
    found = [line for folder in ("tests", "experiments") for line in around_the_faces(root / folder)]
    assert not found, "import these through the subpackage's face:\n" + "\n".join(found)


def test_the_private_module_explains_and_uses_each_name():
    import remat_opt._jax_private as private

    doc = private.__doc__ or ""
    unexplained = [name for name in private.__all__ if f"{name}`" not in doc]
    assert not unexplained, f"{PRIVATE_MODULE}'s docstring should say why each name is needed: {unexplained}"
    used = {alias for module in MODULES if module != PRIVATE_MODULE
            for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_jax_private")
            for alias in (a.name for a in node.names)}
    assert set(private.__all__) <= used, f"unused private names: {set(private.__all__) - used}"


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    tangles = sorted((sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1), key=len)
    shown = ["\n    ".join(_edge(graph, a, b) for a, b in nx.find_cycle(graph.subgraph(t))) for t in tangles]
    assert not tangles, (f"{len(tangles)} group(s) of modules import each other; a cycle in each:\n    "
                         + "\n\n    ".join(shown))


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if layer(m) == "unplaced")
    assert not unplaced, (f"modules in no layer: {unplaced}; put each in a subpackage, or name it in CORE, "
                          "PLAN or FACE (and say why)")


@pytest.mark.parametrize("lower", sorted(MAY_IMPORT))
def test_imports_run_down_the_layers(lower):
    graph = import_graph()
    upward = [_edge(graph, a, b) for a, b in graph.edges
              if layer(a) == lower and layer(b) != lower and layer(b) not in MAY_IMPORT[lower]]
    assert not upward, (f"{lower} may import only from {sorted(MAY_IMPORT[lower]) or 'itself'}; upward:\n"
                        + "\n".join(sorted(upward)))


MAX_PARAMETERS = 6
MAX_CODE_LINES = 50
WIDE_FACES = {"remat_opt._api.optimize", "remat_opt._step.optimize_step"}
"""The public entry points: their keyword options are :class:`remat_opt._options.PlanOptions`'
fields, spelled out for the user (tests/test_options.py holds the signatures to the defaults)."""


def functions() -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, list[str]]]:
    """Every function and method of remat_opt: its qualified name, node and source lines."""
    for module, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{module}.{node.name}", node, source.splitlines()


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    named = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg not in ("self", "cls")]
    return named + [a.arg for a in (args.vararg, args.kwarg) if a is not None]


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of the body that hold code: no docstring, blank line or comment."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    spanned = {k for stmt in body for k in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)}
    return sum(1 for k in spanned if lines[k - 1].strip() and not lines[k - 1].strip().startswith("#"))


def test_the_measures_see_a_wide_long_function():
    wide = {name: (len(parameters(node)), code_lines(node, lines)) for name, node, lines in functions()}
    assert wide["remat_opt._api.optimize"][0] > MAX_PARAMETERS
    assert all(n >= 0 for n, _ in wide.values()) and max(lines for _, lines in wide.values()) > 20


def test_functions_are_a_screen_long_and_take_few_parameters():
    too_wide = sorted(f"{name}: {len(parameters(node))} parameters" for name, node, _ in functions()
                      if len(parameters(node)) > MAX_PARAMETERS and name not in WIDE_FACES)
    too_long = sorted(f"{name}: {code_lines(node, lines)} lines of code" for name, node, lines in functions()
                      if code_lines(node, lines) > MAX_CODE_LINES)
    assert not too_wide + too_long, ("pass an object that names the concept, or split the function:\n"
                                     + "\n".join(too_wide + too_long))


PERCENTAGE = re.compile(r"\d+(?:\.\d+)?\s?%")
KEPT_PERCENTAGES = {
    ("remat_opt._plan", '"FEASIBLE, gap 12.3%"'): "an example of the status text the property formats",
    ("remat_opt._plan", "a gap of 100%"): "a definition: a gap of 1.0 or more is shown as no lower bound",
    ("remat_opt.planner._loop_planning", "(and 1% of the"): "the margin the code takes off (budget // 100)",
}
"""Per (module, fragment of the line), why a percentage in a docstring or comment is not a
measurement: a constant the code uses, a definition or an example of output."""


def prose_lines(source: str) -> Iterator[tuple[int, str]]:
    """The lines of ``source``'s docstrings (every string standing as a statement: a module's,
    class's, function's or attribute's) and its comments, with their numbers."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for k in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                yield k, lines[k - 1]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def percentages_in_prose() -> Iterator[tuple[str, int, str]]:
    """Every docstring or comment line of remat_opt that holds a percentage: module, line, text."""
    for module, path in MODULES.items():
        for line, text in prose_lines(path.read_text(encoding="utf-8")):
            if PERCENTAGE.search(text):
                yield module, line, text.strip()


def kept_fragment(module: str, text: str) -> str | None:
    """The fragment of :data:`KEPT_PERCENTAGES` that ``text`` of ``module`` holds, if any."""
    return next((fragment for m, fragment in KEPT_PERCENTAGES if m == module and fragment in text), None)


def test_the_prose_scan_sees_docstrings_and_comments_not_code():
    source = ('x = 1  # ran 5% faster\n"""An attribute\'s docstring: 12.5 % less."""\n\n\n'
              'def f():\n    """Cut the error\n    to 3%."""\n    return f"{x:.1%}"\n')
    assert sorted(line for line, text in prose_lines(source) if PERCENTAGE.search(text)) == [1, 2, 7]


def test_docstrings_and_comments_hold_no_measured_percentage():
    found = list(percentages_in_prose())
    measured = [f"{module}:{line}: {text}" for module, line, text in found if kept_fragment(module, text) is None]
    assert not measured, ("a docstring states the contract and a one-line why: move each measured figure "
                          "to docs/measurements.md and point there (or, if it is a constant or a "
                          "definition, add it to KEPT_PERCENTAGES with why):\n" + "\n".join(measured))
    stale = set(KEPT_PERCENTAGES) - {(module, kept_fragment(module, text)) for module, _, text in found}
    assert not stale, f"KEPT_PERCENTAGES entries no docstring or comment holds any more: {sorted(stale)}"
