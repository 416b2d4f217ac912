"""The step-time search (``objective="time"``): per-layer plans found on the program, run on the device.

On the CPU these check the search's logic and guarantees (what it returns fits and
is the fastest it ran; gradients are the plain program's; a candidate the device
cannot fit is a figure, not a crash). How fast its plans are against the one-line
policies is measured on a TPU by experiments/step_time.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_opt
from remat_opt.memory import _timing
from remat_opt.planner import _timed
from remat_opt.program import trace
from remat_opt.rewrite import LayerPlan, layer_program
from remat_opt.program._trace import with_signature
from remat_opt.solve import layers_of

WIDTH, HIDDEN, LAYERS = 64, 256, 4


def residual_mlp(params, x):
    """A pre-LN residual MLP written as a plain Python loop over layer dicts, no annotation."""
    for layer in params["layers"]:
        h = (x - x.mean(-1, keepdims=True)) * layer["scale"]
        x = x + jax.nn.gelu(h @ layer["w_in"]) @ layer["w_out"]
    return jnp.mean((x @ params["head"]) ** 2)


def residual_mlp_args():
    """``residual_mlp``'s parameters and batch (also ``tests/test_step_time_limits.py``'s)."""
    key = jax.random.PRNGKey(1)
    keys = iter(jax.random.split(key, 3 * LAYERS + 2))
    layers = [{"scale": jnp.ones((WIDTH,)),
               "w_in": jax.random.normal(next(keys), (WIDTH, HIDDEN)) / WIDTH**0.5,
               "w_out": jax.random.normal(next(keys), (HIDDEN, WIDTH)) / HIDDEN**0.5} for _ in range(LAYERS)]
    params = {"layers": layers, "head": jax.random.normal(next(keys), (WIDTH, 8)) / WIDTH**0.5}
    return params, jax.random.normal(next(keys), (4096, WIDTH))


@pytest.fixture(scope="module")
def mlp_args():
    return residual_mlp_args()


def close(got, want):
    return all(np.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def test_the_layers_of_a_loop_are_found_on_the_program(mlp_args):
    layers = layers_of(trace(residual_mlp, mlp_args, {}, (0,)))
    assert layers is not None and layers.count == LAYERS
    bounds = layers.bounds()
    assert bounds[0] == 0 and len(layers.layer_stages()) == LAYERS


@pytest.mark.parametrize("fenced", [False, True])
def test_a_layer_plan_has_the_programs_gradients(mlp_args, fenced):
    traced = trace(residual_mlp, mlp_args, {}, (0,))
    layers = layers_of(traced)
    policies = [None] * (len(layers.bounds()) - 1)
    for stage, policy in zip(layers.layer_stages(), ("nothing_saveable", "dots_saveable", None, "nothing_saveable")):
        policies[stage] = policy
    plan = LayerPlan(layers.bounds(), tuple(policies), fenced)
    program = with_signature(residual_mlp, traced, layer_program(traced, plan))
    assert close(jax.jit(jax.grad(program))(*mlp_args), jax.grad(residual_mlp)(*mlp_args))
    assert "3 layers checkpointed" in str(plan)


def test_a_layer_plan_rejects_bounds_that_do_not_match_its_policies():
    with pytest.raises(ValueError, match="bounds"):
        LayerPlan((0, 5, 3), (None, None))
    with pytest.raises(ValueError, match="policy"):
        LayerPlan((0, 5), ("saves_everything",))


def test_the_search_returns_the_fastest_candidate_that_fits(mlp_args):
    plain = remat_opt.peak_bytes(residual_mlp, *mlp_args)
    budget = int(0.8 * plain)
    step = remat_opt.optimize(residual_mlp, budget, objective="time", cache=False)
    plan = step.plan(*mlp_args)
    assert plan.status == "TIMED" and plan.fits
    assert remat_opt.peak_bytes(step, *mlp_args) == plan.measured_peak_bytes <= budget
    run = [t for t in plan.timed if t.step_seconds is not None]
    assert run and all(t.peak_bytes <= budget for t in run)
    assert plan.step_seconds == min(t.step_seconds for t in run)
    assert all(t.step_seconds is None for t in plan.timed if t.peak_bytes is None or t.peak_bytes > budget)
    assert any("chosen by time" in t.label for t in plan.timed)  # the layers saving what the time model chose
    assert close(jax.jit(jax.grad(step))(*mlp_args), jax.grad(residual_mlp)(*mlp_args))
    # Bare checkpoints only where XLA honoured them (jax 0.10's XLA:CPU undoes them, docs/xla_findings.md §1;
    # jax 0.12's does not): the bare one saving nothing lowered the plain peak by a quarter or more.
    bare = [t for t in plan.timed if t.label == "every layer nothing_saveable"]
    if plan.layer_plan is not None and not plan.layer_plan.fenced:
        assert bare and bare[0].peak_bytes <= 0.75 * plain
    assert "step" in str(plan) and "ms" in str(plan)


def test_of_the_plans_between_the_one_line_ones_only_those_the_time_model_prices_lowest_are_compiled(
        mlp_args, caplog):
    def loss(params, x):  # a function of its own: nothing this process measured is recalled
        return residual_mlp(params, x)

    plain = remat_opt.peak_bytes(residual_mlp, *mlp_args)
    with caplog.at_level("INFO", logger="remat_opt"):
        plan = remat_opt.optimize(loss, int(0.8 * plain), objective="time", cache=False).plan(*mlp_args)
    assert plan.fits and "the time model prices lowest: not compiled" in caplog.text
    between = [t.label for t in plan.timed if t.label.startswith(("layers:", "every layer saving"))]
    for family in (False, True):  # bare, and fenced where its own round ran
        assert len([b for b in between if b.endswith("(fenced)") == family]) <= _timed.BETWEEN_COMPILES


def test_a_candidate_the_device_cannot_fit_is_a_figure_not_a_crash(mlp_args, monkeypatch):
    plain = remat_opt.peak_bytes(residual_mlp, *mlp_args)
    device = int(0.9 * plain)  # a device smaller than the plain step: XLA says RESOURCE_EXHAUSTED
    real = _timing.memory_of

    def small_device(compiled):
        peak = real(compiled)
        if peak > device:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm: {peak} bytes")
        return peak

    monkeypatch.setattr(_timing, "memory_of", small_device)

    def loss(params, x):  # a function of its own: this process measured residual_mlp on a larger "device"
        return residual_mlp(params, x)

    plan = remat_opt.optimize(loss, device, objective="time", cache=False).plan(*mlp_args)
    assert plan.fits and plan.measured_peak_bytes <= device
    refused = [t for t in plan.timed if t.peak_bytes is None]
    assert any(t.label == "plain" for t in refused) and all("RESOURCE_EXHAUSTED" in t.note for t in refused)


def test_nothing_that_fits_is_refused_with_the_lowest_peak_measured(mlp_args):
    plain = remat_opt.peak_bytes(residual_mlp, *mlp_args)
    step = remat_opt.optimize(residual_mlp, int(0.2 * plain), objective="time", cache=False)
    with pytest.raises(remat_opt.InfeasibleBudgetError) as err:
        step.plan(*mlp_args)
    assert int(0.2 * plain) < err.value.min_budget_bytes <= plain
    assert "step-time search" in str(err.value)


def test_options_of_the_step_time_search_are_checked():
    with pytest.raises(remat_opt.InvalidOptionError, match="objective"):
        remat_opt.optimize(residual_mlp, "1MiB", objective="speed")
    if jax.default_backend() == "cpu":
        with pytest.raises(remat_opt.InvalidBudgetError, match="device"):
            remat_opt.optimize(residual_mlp, "device")


@pytest.mark.scripts
def test_the_step_time_table_runs_where_it_is(tmp_path):
    # experiments/step_time.py, as on the TPU, on a CPU-sized GPT: every plan it returns fits its budget
    # and has the plain program's gradients.
    from experiment_scripts import read_rows, run_script

    run_script("step_time.py", "--programs", "tiny_gpt", "--fractions", "0.6", "--repeats", "2",
               "--objective", "time", "--quick", "--out", str(tmp_path))
    rows = read_rows(tmp_path / f"step_time_{jax.default_backend()}.csv")
    plans = [r for r in rows if r["kind"] == "plan"]
    assert {r["strategy"] for r in rows if r["kind"] == "layer"} == {
        "layer/nothing_saveable", "layer/dots_with_no_batch_dims_saveable", "layer/dots_saveable"}
    assert len(plans) == 1
    for r in plans:
        assert r["exception"] or (r["fits"] == "True" and float(r["grad_error_over_tolerance"]) <= 1.0), r
    # On the CPU the float32-precision reference is the plain step: its row reads 0, and every other
    # row's distance from it is float32 rounding, not a different gradient.
    plain = next(r for r in rows if r["strategy"] == "plain")
    assert float(plain["grad_error_vs_highest"]) == 0.0
    assert all(float(r["grad_error_vs_highest"]) < 1e-5 for r in rows if r["grad_error_vs_highest"]), rows


def test_a_timed_plan_is_kept_on_disk_and_loaded_as_made(mlp_args, tmp_path, monkeypatch):
    plain = remat_opt.peak_bytes(residual_mlp, *mlp_args)
    budget = int(0.8 * plain)

    def loss(params, x):  # measured by no other test of this process
        return residual_mlp(params, x)

    made = remat_opt.optimize(loss, budget, objective="time", cache=tmp_path).plan(*mlp_args)
    assert made.layer_plan is not None
    # A later process: nothing is compiled or run again.
    monkeypatch.setattr("remat_opt.planner._optimize.timed_plan", lambda call: pytest.fail("planned again"))
    step = remat_opt.optimize(loss, budget, objective="time", cache=tmp_path)
    loaded = step.plan(*mlp_args)
    assert (loaded.layer_plan, loaded.measured_peak_bytes, loaded.step_seconds, loaded.timed) == (
        made.layer_plan, made.measured_peak_bytes, made.step_seconds, made.timed)
    assert remat_opt.peak_bytes(step, *mlp_args) == made.measured_peak_bytes
    assert close(jax.jit(jax.grad(step))(*mlp_args), jax.grad(residual_mlp)(*mlp_args))
    # A plan made for FLOPs is not served for time, nor the other way round.
    monkeypatch.undo()
    flops = remat_opt.optimize(loss, budget, objective="flops", cache=tmp_path).plan(*mlp_args)
    assert flops.status != "TIMED"


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_on_the_cpu_no_fenced_per_layer_policy_recomputes_less(mlp_args, policy):
    # The FLOP search (the CPU's default) at the peak of a per-layer policy a user could write with
    # remat_opt's fence, on layers found in a plain loop over layer dicts: it fits, and recomputes no
    # more FLOPs than that policy.
    from remat_opt.planner._candidates import per_layer_plan
    from remat_opt.memory import gradient_flops

    traced = trace(residual_mlp, mlp_args, {}, (0,))
    layers = layers_of(traced)
    plan = per_layer_plan(layers, [policy] * layers.count, fenced=True)
    baseline = with_signature(residual_mlp, traced, layer_program(traced, plan))
    budget = remat_opt.peak_bytes(baseline, *mlp_args)
    flops = gradient_flops(baseline, mlp_args, {}, 0) - gradient_flops(residual_mlp, mlp_args, {}, 0)
    step = remat_opt.optimize(residual_mlp, budget, cache=False)
    ours = step.plan(*mlp_args)
    assert ours.fits and remat_opt.peak_bytes(step, *mlp_args) <= budget
    assert ours.measured_recompute_flops <= flops
    assert close(jax.jit(jax.grad(step))(*mlp_args), jax.grad(residual_mlp)(*mlp_args))


def test_candidates_are_timed_on_the_calls_own_arrays_not_a_copy(mlp_args):
    # A copy of the parameters and batch beside the user's own would not fit a step planned near
    # the device's memory. Only where the call's arrays are not concrete (a plan made under jit's
    # trace, NumPy leaves) are arrays of their shapes made.
    from remat_opt.memory import abstract

    specs = (abstract(mlp_args), abstract({}))
    own_args, _ = _timing.run_inputs(residual_mlp, mlp_args, {}, 0, False, specs)
    assert all(a is b for a, b in zip(jax.tree.leaves(own_args), jax.tree.leaves(mlp_args)))
    as_numpy = jax.tree.map(np.asarray, mlp_args)
    made, _ = _timing.run_inputs(residual_mlp, as_numpy, {}, 0, False, specs)
    assert all(isinstance(a, jax.Array) and a.shape == b.shape and not a.any()
               for a, b in zip(jax.tree.leaves(made), jax.tree.leaves(mlp_args)))

    seen = []

    @jax.jit
    def traced(params, x):
        seen.append(_timing.run_inputs(residual_mlp, (params, x), {}, 0, False, specs))
        return x

    traced(*mlp_args)
    made_under_jit = jax.tree.leaves(seen[0])
    assert all(not isinstance(a, jax.core.Tracer) and not a.any() for a in made_under_jit)
