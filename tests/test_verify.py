"""Candidates compiled for their figures only; the plan returned, as the user compiles it (planner/_verify.py)."""

import dataclasses

import jax.numpy as jnp
from jax import lax

import remat_opt
import remat_opt.planner._optimize as optimize_module
from remat_opt import peak_bytes
from remat_opt.planner._mesh import measurer
from remat_opt.planner._verify import verified

FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=2.0, num_workers=2)


@dataclasses.dataclass(frozen=True)
class _Plan:
    measured_peak_bytes: int


def _never():
    raise AssertionError("searched again")


def test_a_plan_whose_figures_agree_is_returned_as_it_is():
    planned = (_Plan(100), "program")
    assert verified(planned, lambda program: 100, 120, _never) is planned


def test_a_disagreeing_figure_that_fits_becomes_the_plans():
    plan, program = verified((_Plan(100), "program"), lambda program: 110, 120, _never)
    assert plan.measured_peak_bytes == 110 and program == "program"


def test_a_disagreeing_figure_over_the_budget_searches_again():
    again = (_Plan(90), "another")
    assert verified((_Plan(100), "program"), lambda program: 130, 120, lambda: again) is again


def mlp(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def scan_loss(ws, x):
    h, _ = lax.scan(lambda h, w: (jnp.sin(jnp.tanh(h @ w)) + h, None), x, ws)
    return jnp.sum(h ** 2)


def conv_loss(k, x):
    y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(jnp.tanh(y) ** 2)


def test_figures_only_compiles_give_the_default_figures():
    programs = [(mlp, ([jnp.full((64, 64), 0.05) for _ in range(4)], jnp.ones((32, 64)))),
                (scan_loss, (jnp.full((6, 48, 48), 0.05), jnp.ones((16, 48)))),
                (conv_loss, (jnp.full((3, 3, 4, 8), 0.1), jnp.ones((2, 16, 16, 4))))]
    for fn, args in programs:
        fast = measurer(args, {}, 0, False, None, figures_only=True)
        assert fast(fn) == peak_bytes(fn, *args), fn.__name__


def test_a_plan_the_user_would_compile_over_the_budget_is_planned_again(monkeypatch, caplog):
    # Figures-only compiles that read 20% low: the plan they pick is over the
    # budget as the user compiles it, so planning runs again on default compiles.
    ws, x = [jnp.full((64, 64), 0.05) for _ in range(6)], jnp.ones((1024, 64))
    budget = int(0.85 * peak_bytes(mlp, ws, x))

    def lying(args, kwargs, nums, has_aux, collectives, figures_only=False):
        measure = measurer(args, kwargs, nums, has_aux, collectives)
        return (lambda f: int(0.8 * measure(f))) if figures_only else measure

    monkeypatch.setattr(optimize_module, "measurer", lying)
    step = remat_opt.optimize(mlp, budget, solver_options=FAST, cache=False)
    with caplog.at_level("WARNING", logger="remat_opt"):
        plan = step.plan(ws, x)
    assert "planning again with default compiles" in caplog.text
    assert plan.measured_peak_bytes <= budget
    assert plan.measured_peak_bytes == peak_bytes(step, ws, x)
