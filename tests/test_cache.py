"""The persistent plan cache: loaded plans make no solver call and compile no
candidate, yet run the program XLA measured; bad entries are never trusted."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat_opt
import remat_opt.memory._pipeline as pipeline_module
import remat_opt.planner._mesh as mesh_module
import remat_opt.planner._flop_search as flop_search
import remat_opt.planner._steering as steering_module
from remat_opt import CacheWarning, peak_bytes
from remat_opt.cache import list_entries

FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=2.0, num_workers=2)


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} was called: the plan should have come from the cache")
    return refuse


def forbid_planning(monkeypatch):
    """Makes every way planning solves or compiles raise (solves, XLA's measure and facts, FLOP counts)."""
    for name in ("solve", "min_peak_schedule", "low_memory_schedules"):
        monkeypatch.setattr(steering_module, name, _refuse(name))
    monkeypatch.setattr(pipeline_module, "read_plain", _refuse("read_plain"))  # every model's XLA facts
    monkeypatch.setattr(flop_search, "gradient_flops", _refuse("gradient_flops"))
    monkeypatch.setattr(mesh_module, "compiled_figures", _refuse("compiled_figures"))  # every program's measure


def _same_plan(loaded, made):
    assert loaded.schedule == made.schedule and loaded.loop_plan == made.loop_plan
    for field in ("budget_bytes", "predicted_peak_bytes", "measured_peak_bytes", "plain_peak_bytes",
                  "recompute_flops", "measured_recompute_flops", "status", "attempts", "segment_peaks",
                  "computed_once"):
        assert getattr(loaded, field) == getattr(made, field), field
    # The graph rebuilt from the entry carries the same decisions as the one planned.
    assert dict(loaded.graph.nodes(data="decision")) == dict(made.graph.nodes(data="decision"))
    assert dict(loaded.graph.nodes(data="segment")) == dict(made.graph.nodes(data="segment"))


def _grads_match(step, fn, *args):
    for g, r in zip(jax.tree.leaves(jax.grad(step)(*args)), jax.tree.leaves(jax.grad(fn)(*args))):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_a_second_optimized_function_loads_the_plan(small_mlp, tmp_path, monkeypatch):
    fn, params, x = small_mlp
    budget = int(0.85 * peak_bytes(fn, params, x))
    made = remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path).plan(params, x)
    assert made.measured_peak_bytes <= budget and len(list(tmp_path.glob("*.json"))) == 1
    forbid_planning(monkeypatch)
    step = remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path)
    loaded = step.plan(params, x)  # planning functions all raise: loaded, not planned
    _same_plan(loaded, made)
    _grads_match(step, fn, params, x)
    monkeypatch.undo()
    # The rebuilt program is the one XLA measured when the plan was made.
    assert peak_bytes(step, params, x) == made.measured_peak_bytes


def test_the_default_folder_is_the_environment_variable(small_mlp, tmp_path, monkeypatch):
    fn, params, x = small_mlp
    monkeypatch.setenv("REMAT_OPT_CACHE_DIR", str(tmp_path / "plans"))
    plain = peak_bytes(fn, params, x)
    plan = remat_opt.optimize(fn, plain + 1).plan(params, x)  # above the plain peak: PLAIN, kept too
    assert plan.status == "PLAIN"
    (entry,) = list_entries(tmp_path / "plans")
    assert entry["valid"] == "ok" and entry["kind"] == "plain" and entry["function"].endswith("tanh_mlp")
    assert entry["measured_peak_bytes"] == plain
    remat_opt.optimize(fn, plain + 1, cache=False).plan(params, x)
    remat_opt.optimize(fn, plain + 2).plan(params, x)  # another budget, another entry
    assert len(list_entries(tmp_path / "plans")) == 2
    with pytest.raises(TypeError, match="cache"):
        remat_opt.optimize(fn, plain, cache=3)


def _entry_file(directory):
    (path,) = list(Path(directory).glob("*.json"))
    return path


@pytest.mark.parametrize("damage", ["garbage", "stale", "tampered"])
def test_a_bad_entry_warns_once_and_is_planned_again(small_mlp, tmp_path, damage):
    fn, params, x = small_mlp
    budget = int(0.85 * peak_bytes(fn, params, x))
    made = remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path).plan(params, x)
    path = _entry_file(tmp_path)
    entry = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])  # a write cut short
    elif damage == "stale":
        entry["versions"]["jax"] = "0.0.1"
        path.write_text(json.dumps(entry))
    else:  # whole and current, but its schedule does not rebuild into the plan it claims
        entry["schedule"]["cuts"] = [1]
        path.write_text(json.dumps(entry))
    step = remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path)
    with pytest.warns(CacheWarning, match={"garbage": "cannot be read", "stale": "stale: made with jax 0.0.1",
                                           "tampered": "does not rebuild"}[damage]):
        replanned = step.plan(params, x)
    assert replanned.schedule == made.schedule and replanned.measured_peak_bytes <= budget
    _grads_match(step, fn, params, x)
    assert list_entries(tmp_path)[0]["valid"] == "ok"  # replaced by the new plan, read without a warning
    remat_opt.optimize(fn, budget, solver_options=FAST, cache=tmp_path).plan(params, x)


WRITER = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp, numpy as np, remat_opt
    def tanh_mlp(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(6)]
    x = jax.random.normal(key, (1024, 64))
    budget = int(sys.argv[2])
    step = remat_opt.optimize(tanh_mlp, budget, cache=sys.argv[1],
                              solver_options=remat_opt.SolverOptions(deterministic_time_limit=2.0, num_workers=1))
    plan = step.plan(params, x)
    for g, r in zip(jax.grad(step)(params, x), jax.grad(tanh_mlp)(params, x)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    assert plan.measured_peak_bytes <= budget
    print(plan.schedule.to_json())
""")


def test_two_writers_at_once_both_plan_and_leave_a_readable_entry(small_mlp, tmp_path):
    fn, params, x = small_mlp
    budget = int(0.85 * peak_bytes(fn, params, x))
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    cache = tmp_path / "plans"
    writers = [subprocess.Popen([sys.executable, str(script), str(cache), str(budget)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "error"})
               for _ in range(2)]
    results = [w.communicate(timeout=300) for w in writers]
    for w, (out, err) in zip(writers, results):
        assert w.returncode == 0, err
    assert results[0][0] == results[1][0]  # the same schedule
    (entry,) = list_entries(cache)
    assert entry["valid"] == "ok" and not list(cache.glob(".tmp-*"))
    # The entry left behind loads in this process, to the same schedule.
    plan = remat_opt.optimize(fn, budget, solver_options=remat_opt.SolverOptions(deterministic_time_limit=2.0,
                              num_workers=1), cache=cache).plan(params, x)
    assert plan.schedule.to_json() == results[0][0].strip()


LAYERS, WIDTH = 6, 32


def scan_loss(params, x):
    stack, w_in = params

    def body(h, w):
        return jnp.tanh(h @ w) + jnp.sin(h @ w_in), None

    h, _ = lax.scan(body, x, stack)
    return jnp.mean(h**2)


def test_a_loop_plan_is_kept_and_loaded(tmp_path, monkeypatch):
    key = jax.random.PRNGKey(0)
    params = (jax.random.normal(key, (LAYERS, WIDTH, WIDTH)) / 6, jax.random.normal(key, (WIDTH, WIDTH)) / 6)
    x = jax.random.normal(jax.random.fold_in(key, 1), (512, WIDTH))
    budget = int(0.8 * peak_bytes(scan_loss, params, x))
    made = remat_opt.optimize(scan_loss, budget, unroll_scans=0, solver_options=FAST, max_attempts=1,
                              cache=tmp_path).plan(params, x)
    assert made.loop_plan is not None, str(made)  # a scan kept whole: the loop plan wins
    forbid_planning(monkeypatch)
    step = remat_opt.optimize(scan_loss, budget, unroll_scans=0, solver_options=FAST, max_attempts=1,
                              cache=tmp_path)
    _same_plan(step.plan(params, x), made)
    _grads_match(step, scan_loss, params, x)
    monkeypatch.undo()
    assert peak_bytes(step, params, x) == made.measured_peak_bytes


def _loss_with_custom_backward(scale):
    """An MLP loss whose activation's backward (a ``custom_vjp``) scales its cotangent: code the
    forward jaxpr names (``bwd=<function ...>``) but does not show."""
    @jax.custom_vjp
    def act(x):
        return jnp.tanh(x)

    act.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (g * scale * (1 - jnp.tanh(x) ** 2),))

    def loss(ws, x):
        for w in ws:
            x = act(x @ w)
        return jnp.mean(x ** 2)

    return loss


def test_a_changed_custom_backward_is_planned_again(tmp_path):
    """Two programs that differ only in a custom_vjp's backward have different keys (their
    figures are not each other's); the same backward again loads."""
    ws = [jnp.full((32, 32), 0.05 * (i + 1)) for i in range(3)]
    x = jnp.ones((16, 32))
    for scale, entries in ((1.0, 1), (3.0, 2), (3.0, 2)):
        fn = _loss_with_custom_backward(scale)
        step = remat_opt.optimize(fn, peak_bytes(fn, ws, x), cache=tmp_path)
        step.plan(ws, x)
        assert len(list(tmp_path.glob("*.json"))) == entries, scale
        _grads_match(step, fn, ws, x)


class _ScaledCosts:
    """A cost model that is not a dataclass: the key names it by its type alone."""

    def __init__(self, scale):
        self.scale = scale

    def eqn_flops(self, eqn):
        return self.scale * remat_opt.FlopCostModel().eqn_flops(eqn)


def test_a_cost_model_the_key_cannot_name_keeps_no_plan(small_mlp, tmp_path):
    """Two such cost models of one type would share a key, so one could be served the
    other's plan: neither is read nor kept, and a warning says how to have it kept."""
    fn, params, x = small_mlp
    budget = peak_bytes(fn, params, x)
    step = remat_opt.optimize(fn, budget, solver_options=FAST, cost_model=_ScaledCosts(1), cache=tmp_path)
    with pytest.warns(CacheWarning, match="not a dataclass"):
        step.plan(params, x)
    assert not list(tmp_path.glob("*.json"))
    # Said once per folder and type: the second is planned afresh, quietly, and not kept either.
    remat_opt.optimize(fn, budget, solver_options=FAST, cost_model=_ScaledCosts(1000), cache=tmp_path).plan(params, x)
    assert not list(tmp_path.glob("*.json"))
    # A dataclass cost model is named by its fields: its plan is kept.
    remat_opt.optimize(fn, budget, solver_options=FAST, cost_model=remat_opt.FlopCostModel(),
                       cache=tmp_path).plan(params, x)
    assert len(list(tmp_path.glob("*.json"))) == 1
