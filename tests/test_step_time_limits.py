"""The step-time search (``objective="time"``) at its limits: larger budgets, devices too small for
its candidates, no candidate that fits, plans made under ``jit``, and its estimates.

Split from ``tests/test_step_time.py`` (the same residual MLP, whose helpers it imports) so that
pytest-xdist (``--dist loadfile``) runs the two halves on its two workers at once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_step_time import LAYERS, close, residual_mlp, residual_mlp_args

import remat_opt
from remat_opt.memory import _timing
from remat_opt.program import trace
from remat_opt.solve import layers_of


@pytest.fixture(scope="module")
def mlp_args():
    return residual_mlp_args()


def test_a_larger_budget_is_never_answered_by_a_slower_plan(mlp_args):
    def loss(params, x):  # its own function: what this process measured is kept per function
        return residual_mlp(params, x)

    plain = remat_opt.peak_bytes(loss, *mlp_args)
    smaller = remat_opt.optimize(loss, int(0.6 * plain), objective="time", cache=False).plan(*mlp_args)
    larger = remat_opt.optimize(loss, int(0.9 * plain), objective="time", cache=False).plan(*mlp_args)
    assert smaller.fits and larger.fits
    # The smaller budget's plan fits the larger one too, and is among its candidates, with its time.
    assert any(t.label == smaller.timed[0].label and t.step_seconds == smaller.step_seconds for t in larger.timed)
    assert larger.step_seconds <= smaller.step_seconds


def test_a_device_too_small_for_every_candidate_is_refused_saying_so(mlp_args, monkeypatch):
    def no_room(compiled):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm")

    # The step-time search's compiles, and the FLOP search's it falls back to.
    monkeypatch.setattr(_timing, "memory_of", no_room)
    monkeypatch.setattr("remat_opt.planner._mesh.memory_of", no_room)

    def loss(params, x):  # a program of its own: nothing measured of it in this process
        return 1.5 * residual_mlp(params, x)

    budget = remat_opt.peak_bytes(residual_mlp, *mlp_args)
    with pytest.raises(remat_opt.InfeasibleBudgetError) as err:
        remat_opt.optimize(loss, budget, objective="time", cache=False).plan(*mlp_args)
    assert err.value.min_budget_bytes > budget  # not "pass budget_bytes >= 0"
    assert "could not fit any" in str(err.value) and "smaller batch" in str(err.value)


def test_candidates_that_lower_to_one_module_are_compiled_once(mlp_args):
    def twin(params, x):  # another function, the same program
        return residual_mlp(params, x)

    def other(params, x):
        return residual_mlp(params, x) * 2.0

    a, b, c = _timing.compile_steps([residual_mlp, twin, other], mlp_args, {}, 0, False)
    assert a is b and a is not c
    assert a.peak_bytes == remat_opt.peak_bytes(residual_mlp, *mlp_args)


def widening_chain(params, x):
    """Matmuls of differing widths: no two alike (its layers are found by primitive alone)."""
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x ** 2)


def no_nesting(monkeypatch):
    """The step-time search without its nested layer groups (tests/test_nested_layers.py), which
    fit these chains: what follows is of the FLOP search after nothing the step-time search built fit."""
    from remat_opt.planner import _timed

    monkeypatch.setattr(_timed._Search, "nested", lambda self, measured, fenced: [])


def test_where_no_candidate_fits_the_flop_search_plans_and_its_step_is_timed(monkeypatch):
    no_nesting(monkeypatch)
    widths = [64, 128, 96, 160, 80, 112, 64]
    keys = jax.random.split(jax.random.PRNGKey(3), len(widths))
    params = [jax.random.normal(k, (a, b)) / a ** 0.5 for k, a, b in zip(keys, widths[:-1], widths[1:])]
    x = jax.random.normal(jax.random.PRNGKey(4), (1024, 64))
    plain = remat_opt.peak_bytes(widening_chain, params, x)
    budget = int(0.9 * plain)  # under the program as written: the step-time search has nothing else
    plan = remat_opt.optimize(widening_chain, budget, objective="time", cache=False).plan(params, x)
    assert plan.layer_plan is None and plan.loop_plan is None and plan.status in ("OPTIMAL", "FEASIBLE")
    assert plan.measured_peak_bytes <= budget and plan.step_seconds is not None and plan.step_seconds > 0
    assert "none of the step-time search's candidates fit" in plan.report()
    step = remat_opt.optimize(widening_chain, budget, objective="time", cache=False)
    assert remat_opt.peak_bytes(step, params, x) <= budget
    assert close(jax.grad(step)(params, x), jax.grad(widening_chain)(params, x))


def test_the_flop_search_after_nothing_fit_stops_where_its_schedules_reach_no_lower(monkeypatch):
    # A device where no schedule of the FLOP search measures under the program as written (as the
    # ResNet's on a TPU, whose schedules the CPU-fitted model put far lower than XLA did): the
    # budget is refused after FALLBACK_PATIENCE compiles, not after every strategy's.
    from remat_opt.planner import _mesh
    from remat_opt.planner import OptimizedFunction

    no_nesting(monkeypatch)
    widths = [64, 128, 96, 160, 80, 112, 64]
    keys = jax.random.split(jax.random.PRNGKey(7), len(widths))
    params = [jax.random.normal(k, (a, b)) / a ** 0.5 for k, a, b in zip(keys, widths[:-1], widths[1:])]
    x = jax.random.normal(jax.random.PRNGKey(8), (1024, 64))

    def loss(params, x):  # a function of its own: nothing measured of it before
        return widening_chain(params, x)

    plain, real, compiles = remat_opt.peak_bytes(loss, params, x), _mesh.memory_of, []
    monkeypatch.setattr(_mesh, "memory_of", lambda compiled: compiles.append(1) or max(real(compiled), plain))
    with pytest.raises(remat_opt.InfeasibleBudgetError, match="stopped after 5 compiles") as refused:
        remat_opt.optimize(loss, int(0.9 * plain), objective="time", cache=False).plan(params, x)
    # The lower of plain and the step-time search's least (on jax 0.12 a per-layer plan is lower).
    assert refused.value.min_budget_bytes <= plain
    # The plain step's peak is already known to the search; each compile after it is counted.
    assert len(compiles) <= OptimizedFunction.FALLBACK_PATIENCE == 5


def test_a_schedule_the_device_cannot_fit_is_a_figure_not_a_crash(monkeypatch):
    # The FLOP search's measurements on a device smaller than the plain step: XLA's out-of-memory
    # error is a peak no budget admits, and the search goes on to a plan that fits.
    from remat_opt.planner import _mesh

    widths = [64, 128, 96, 160, 80, 112, 64]
    keys = jax.random.split(jax.random.PRNGKey(5), len(widths))
    params = [jax.random.normal(k, (a, b)) / a ** 0.5 for k, a, b in zip(keys, widths[:-1], widths[1:])]
    x = jax.random.normal(jax.random.PRNGKey(6), (1024, 64))
    plain = remat_opt.peak_bytes(widening_chain, params, x)
    device, real = int(0.95 * plain), _mesh.memory_of

    def small_device(compiled):
        peak = real(compiled)
        if peak > device:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm: {peak} bytes")
        return peak

    monkeypatch.setattr(_mesh, "memory_of", small_device)

    def loss(params, x):  # a function of its own: nothing measured of it before
        return widening_chain(params, x)

    budget = int(0.9 * plain)
    plan = remat_opt.optimize(loss, budget, objective="flops", cache=False).plan(params, x)
    assert plan.measured_peak_bytes <= budget
    assert _mesh.beyond_device() > device


def test_a_step_first_planned_under_jit_runs_its_candidates_on_the_device(mlp_args):
    # The README's usage on an accelerator: jit(value_and_grad(step)) with no step.plan() first.
    # The plan is made while jit traces; its candidates must still run, not be staged.
    def loss(params, x):  # a program of its own: nothing measured of it in this process
        return 1.25 * residual_mlp(params, x)

    budget = int(0.8 * remat_opt.peak_bytes(loss, *mlp_args))
    step = remat_opt.optimize(loss, budget, objective="time", cache=False)
    value, grads = jax.jit(jax.value_and_grad(step))(*mlp_args)
    plan = step.plan(*mlp_args)
    assert plan.fits and plan.step_seconds is not None and plan.step_seconds > 0
    assert all(t.step_seconds is None or t.step_seconds > 0 for t in plan.timed)
    assert close(grads, jax.grad(loss)(*mlp_args)) and np.allclose(value, loss(*mlp_args), rtol=1e-6)


def test_a_candidate_estimated_over_the_budget_is_not_compiled(mlp_args):
    # The estimate of a per-layer plan, from peaks XLA measured: the least-memory uniform plan's,
    # plus per layer its policy's share of what that policy's uniform plan (or the plain step) adds.
    import dataclasses
    from remat_opt.memory._timing import Compiled
    from remat_opt.planner._candidates import Candidate, TimedCall
    from remat_opt.planner._timed import OVER_ESTIMATE, _Search

    traced = trace(residual_mlp, mlp_args, {}, (0,))
    layers = layers_of(traced)
    assert layers is not None and layers.count == LAYERS
    peaks = {"plain": 1000, "every layer nothing_saveable": 200, "every layer dots_with_no_batch_dims_saveable": 400,
             "every layer dots_saveable": 600}

    def search(budget):
        call = TimedCall(residual_mlp, mlp_args, {}, (0,), 0, False, budget)
        s = _Search(call, traced, layers)
        measured = [dataclasses.replace(c, compiled=Compiled(None, peaks[c.label], 0.0, None, ()))
                    for c in [Candidate("plain", residual_mlp), *s.uniform(fenced=False)]]
        return s, measured

    s, measured = search(400)
    mix = ["nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable", "dots_saveable"]
    assert s.estimate(measured, mix) == 200 + (0 + 200 + 400 + 400) / LAYERS
    assert s.estimate(measured, ["nothing_saveable"] * 3 + [40.0]) == 240
    over = s._mix("nothing_saveable", "dots_saveable", 3, last_plain=False, measured=measured)
    under = s._mix("nothing_saveable", "dots_saveable", 1, last_plain=False, measured=measured)
    assert (over.estimate, under.estimate) == (200 + 3 * 400 / LAYERS, 200 + 400 / LAYERS)
    assert over.estimate > OVER_ESTIMATE * 400 >= under.estimate
    assert s.within_reach([over, under]) == [under]
    # Without the peaks it needs, or with a layer as written (what that adds, no peak says): no
    # estimate, and the candidate is compiled.
    assert s.estimate(measured[:2], ["dots_saveable"] * LAYERS) is None
    last = s._mix("nothing_saveable", "dots_saveable", 2, last_plain=True, measured=measured)
    assert last.estimate is None and s.within_reach([last]) == [last]


def test_a_timed_plans_estimates_never_skip_a_candidate_that_fits(mlp_args, monkeypatch):
    """A candidate estimated over OVER_ESTIMATE of the budget is not compiled: an estimate over
    XLA's peak by more than that margin could skip one that fits. Under XLA's peak, it costs a
    compile only (on XLA:CPU the fenced saved sets' estimates run up to a quarter under)."""
    from remat_opt.planner._timed import OVER_ESTIMATE

    def loss(params, x):  # a program of its own: nothing measured of it in this process
        return 0.75 * residual_mlp(params, x)

    # The device's clock, replaced: the candidate that uses the most of the budget runs fastest,
    # as the mixes and time-chosen saves (the estimated candidates) are made to. On a loaded CPU
    # the real winner is whichever ran fastest that moment.
    monkeypatch.setattr("remat_opt.planner._timed.step_seconds",
                        lambda compiled, inputs, repeats=5: None if compiled.executable is None
                        else 1.0 / compiled.peak_bytes)

    plain = remat_opt.peak_bytes(loss, *mlp_args)
    estimated = []
    for share in (0.9, 0.7, 0.5):
        plan = remat_opt.optimize(loss, int(share * plain), objective="time", cache=False).plan(*mlp_args)
        estimated += [t for t in plan.timed if t.estimated_peak_bytes is not None and t.peak_bytes is not None]
        if plan.status == "TIMED" and plan.predicted_peak_bytes is not None:  # an estimated winner
            assert plan.predicted_peak_bytes == plan.timed[0].estimated_peak_bytes, plan
    assert estimated, "no estimated candidate was compiled: the test checks nothing"
    for t in estimated:
        assert t.estimated_peak_bytes <= OVER_ESTIMATE * t.peak_bytes, t
