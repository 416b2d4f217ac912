"""The plan a person reads: the report, the DOT export, the plot, and source lines."""

import dataclasses
import inspect
import re
import warnings

import jax
import jax.numpy as jnp
import pytest
from experiment_scripts import run_script

import remat_opt
from remat_opt import format_bytes, peak_bytes

FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=2.0, num_workers=2)


def blocks(params, x):
    for w1, w2 in params:
        h = x - jnp.mean(x, -1, keepdims=True)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5)
        x = x + jnp.tanh(h @ w1) @ w2
    return jnp.mean(x**2)


LINES, FIRST = inspect.getsourcelines(blocks)
BLOCK_LINES = {f"{__file__}:{FIRST + i}" for i in range(len(LINES))}
TANH_LINE = f"{__file__}:{FIRST + next(i for i, line in enumerate(LINES) if 'tanh' in line)}"


@pytest.fixture(scope="module")
def plan():
    key = jax.random.PRNGKey(0)
    params = [(jax.random.normal(jax.random.fold_in(key, i), (64, 128)) / 8,
               jax.random.normal(jax.random.fold_in(key, 100 + i), (128, 64)) / 11) for i in range(6)]
    x = jax.random.normal(key, (512, 64))
    plan = remat_opt.optimize(blocks, int(0.5 * peak_bytes(blocks, params, x)), solver_options=FAST).plan(params, x)
    assert plan.num_segments > 2 and plan.schedule.saved and plan.recompute_flops > 0, str(plan)
    return plan


def test_every_value_names_the_users_line(plan):
    graph = plan.graph
    sources = {v: d["source"] for v, d in graph.nodes(data=True) if d["primitive"] not in ("input",)}
    assert not any("remat_opt" in s for s in sources.values())  # no line of remat_opt's own
    names = [v for v, d in graph.nodes(data=True) if d["primitive"] == "name"]
    assert names
    for v in names:  # a saved name points at the line of the value it names
        (named,) = graph.predecessors(v)
        assert sources[v] == sources[named] != ""
    assert all(sources.values()) and set(sources.values()) <= BLOCK_LINES


def _line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return f"{inspect.getsourcefile(fn)}:{first + next(i for i, line in enumerate(lines) if text in line)}"


def _helper(x):
    return jnp.tanh(x) * 2.0


_jitted_helper = jax.jit(_helper)


def _calls_a_jitted_helper(w, x):
    h = jnp.where(x > 0, x @ w, 0.0)
    return jnp.sum(_jitted_helper(h) @ w)


def test_a_users_jitted_helper_names_its_own_body_and_jnp_its_call_site():
    # The innermost frame outside jax and remat_opt: a line of the user's jitted helper's
    # body for its values; the line calling jnp.where for the values of its (cached) body.
    w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
    plan = remat_opt.no_remat(remat_opt.BaselineCall(_calls_a_jitted_helper, (w, x), budget_bytes=2**30))
    sources = {d["primitive"]: d["source"] for _, d in plan.graph.nodes(data=True) if d["primitive"] != "input"}
    assert sources["tanh"] == _line_of(_helper, "jnp.tanh")
    assert sources["select_n"] == _line_of(_calls_a_jitted_helper, "jnp.where")


def test_the_report_lists_each_segment_with_its_decisions(plan):
    assert "\n" not in str(plan)
    text = plan.report()
    assert text.splitlines()[0] == str(plan)
    assert len(plan.segment_peaks) == plan.num_segments and max(plan.segment_peaks) == plan.predicted_peak_bytes
    for k, peak in enumerate(plan.segment_peaks):
        assert f"segment {k}: positions" in text and f"predicted peak {format_bytes(peak)}" in text
    rows = remat_opt._report.segment_rows(plan)
    saved = {v for rs in rows.values() for r in rs if r["what"] == "saved by name" for v in r["nodes"]}
    # The values the schedule saves by name, each once; in the last segment, which runs as
    # written, only those its backward reads (the others are not stored at all).
    named = {next(iter(plan.graph.predecessors(v))) for v in plan.schedule.saved}
    last = {v for v in named if plan.graph.nodes[v]["position"] >= max(plan.schedule.cuts)}
    # A saved name no backward reads stores nothing (JAX's policy keeps residuals only): not listed.
    unread = {v for v in plan.schedule.saved if plan.graph.nodes[v]["decision"] == "free"}
    assert not any(plan.graph.nodes[v]["residual"] for v in unread)
    unread_values = {next(iter(plan.graph.predecessors(v))) for v in unread}
    assert named - last - unread_values <= saved <= named and len(saved) < len(named)
    recomputed = [r for rs in rows.values() for r in rs if r["what"] == "recomputed"]
    assert any(r["source"] == TANH_LINE and "tanh" in r["primitives"] for r in recomputed)
    assert f"saved by name {len(saved)} value(s)" in text
    no_schedule = dataclasses.replace(plan, schedule=None)
    assert "not a schedule" in no_schedule.report()


def test_the_status_says_a_gap_only_where_a_bound_above_zero_is_known(plan):
    def status(**fields):
        return dataclasses.replace(plan, loop_plan=None, whole_policy=None, **fields)

    assert status(status="OPTIMAL", gap=0.0).status_text == "OPTIMAL"
    assert status(status="FEASIBLE", gap=0.123).status_text == "FEASIBLE, gap 12.3%"
    unbounded = status(status="FEASIBLE", gap=1.0)
    assert unbounded.status_text == "FEASIBLE, no lower bound"
    assert "no lower bound" in str(unbounded) and "gap" not in str(unbounded)


def test_the_dot_export_reads_back_with_the_plans_decisions(plan, tmp_path):
    pydot = pytest.importorskip("pydot")
    path = tmp_path / "plan.dot"
    assert plan.to_dot(str(path)) == path and path.is_file()  # the path, for `dot -Tsvg` and the like
    with warnings.catch_warnings():  # pydot 4.0's parser calls names pyparsing 3.3 deprecates
        warnings.simplefilter("ignore", DeprecationWarning)
        (dot,) = pydot.graph_from_dot_file(str(path))
    nodes = {n.get_name(): n for n in dot.get_nodes() if n.get_name() not in ("node", "edge", "graph")}
    assert len(nodes) == plan.graph.number_of_nodes() and len(dot.get_edges()) == plan.graph.number_of_edges()
    colours = {"save": "palegreen", "recompute": "salmon"}
    for v, decision in plan.graph.nodes(data="decision"):
        if decision in colours:
            assert nodes[str(v)].get("fillcolor").strip('"') == colours[decision]
            assert nodes[str(v)].get("source").strip('"') == plan.graph.nodes[v]["source"]


def test_the_plot_draws_the_segments_against_budget_and_xla(plan, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plan.png"
    fig = plan.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = fig.axes
    mib = 2.0**20
    assert [p.get_height() for p in ax.patches] == pytest.approx([p / mib for p in plan.segment_peaks])
    levels = {round(line.get_ydata()[0] * mib) for line in ax.get_lines()}
    assert {plan.budget_bytes, plan.measured_peak_bytes, plan.plain_peak_bytes} <= levels
    with pytest.raises(ValueError, match="no per-segment prediction"):
        dataclasses.replace(plan, segment_peaks=()).plot()


@pytest.mark.scripts
def test_the_plan_report_script(tmp_path):
    # experiments/lab/plan_report.py on the zoo MLP (the GPT takes minutes): report, plot, DOT,
    # and a second process that loads the plan from the cache in a tenth of the first
    # plan() or less.
    png, dot = tmp_path / "plot.png", tmp_path / "plan.dot"
    out = run_script("lab/plan_report.py", "--model", "mlp", "--fraction", "0.9", "--out", str(png), "--dot", str(dot))
    assert "segment 0: positions" in out and png.read_bytes()[:4] == b"\x89PNG" and dot.read_text().startswith(
        "strict digraph")
    first, second = map(float, re.search(r"plan\(\): ([\d.]+) s in this process; ([\d.]+) s in a second", out).groups())
    assert second <= 0.1 * first, out.splitlines()[-1]
