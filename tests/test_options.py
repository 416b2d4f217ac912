"""optimize's options have one default each, in PlanOptions, and are checked where they are made."""

from __future__ import annotations

import dataclasses
import inspect

import jax.numpy as jnp
import pytest

import remat_opt
from remat_opt._options import PlanOptions


def test_optimize_shows_the_defaults_plan_options_hold():
    """Every option of ``optimize`` is a field of PlanOptions, in the same order, with the same
    default (or none, for the budget): a default changed in one place only fails here."""
    shown = {name: p.default for name, p in inspect.signature(remat_opt.optimize).parameters.items()
             if name != "fn"}
    held = {f.name: f.default for f in dataclasses.fields(PlanOptions)}
    assert list(shown) == list(held)
    differ = {name: (shown[name], held[name]) for name in shown
              if (shown[name] is inspect.Parameter.empty) != (held[name] is dataclasses.MISSING)
              or (held[name] is not dataclasses.MISSING and shown[name] != held[name])}
    assert not differ, f"optimize's default vs PlanOptions' (name: (shown, held)): {differ}"
    assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(PlanOptions))


def test_optimize_plans_with_the_options_it_was_given():
    step = remat_opt.optimize(lambda w: jnp.sum(jnp.tanh(w)), "1MiB", unroll_scans=0, cache=False)
    assert step.options == PlanOptions(2**20, unroll_scans=0, cache=False)
    assert step.options.solver == remat_opt.SolverOptions() and step.options.links == remat_opt.Interconnect()
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.options.cache = True  # type: ignore[misc]


@pytest.mark.parametrize("options, error, named", [
    ({"budget_bytes": 0}, remat_opt.InvalidBudgetError, "budget_bytes"),
    ({"budget_bytes": 1024, "max_attempts": 0}, remat_opt.InvalidOptionError, "max_attempts"),
    ({"budget_bytes": 1024, "objective": "speed"}, remat_opt.InvalidOptionError, "objective"),
    ({"budget_bytes": 1024, "compute_saved_once": None}, remat_opt.InvalidOptionTypeError, "compute_saved_once"),
])
def test_plan_options_are_checked_when_made(options, error, named):
    with pytest.raises(error) as info:
        PlanOptions(**options)
    assert info.value.argument == named
