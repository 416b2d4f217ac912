"""Equinox's GPT under ``remat_opt.optimize``, through ``eqx.filter_value_and_grad``'s step.

The Equinox decoder of ``tests/test_libraries.py`` (``eqx_gpt``: blocks stacked by
``eqx.filter_vmap`` and run by ``lax.scan`` over ``eqx.partition``/``eqx.combine``), planned at
0.6 of its plain peak and checked as the Flax ones are there: XLA's peak of the user's own
compiled step against the budget, its values and gradients against the plain step's. A file
of its own so that pytest-xdist (``--dist loadfile``) runs it beside the Flax plans.
"""

from __future__ import annotations

import jax
import pytest
from test_libraries import ATTEMPTS, FAST, FRACTIONS, assert_tree_close, eqx_gpt, eqx_loss, tokens

import remat_opt
from remat_opt import peak_bytes
from remat_opt.memory import memory_of


@pytest.fixture(scope="module")
def eqx_case():
    eqx, model = eqx_gpt()
    x, y = tokens()
    reference = eqx.filter_jit(eqx.filter_value_and_grad(eqx_loss)).lower(model, x, y).compile()
    return eqx, model, x, y, peak_bytes(eqx_loss, model, x, y), reference


def test_equinox_model_has_static_leaves(eqx_case):
    eqx, model, x, y, plain, _ = eqx_case
    kinds = {type(leaf) for leaf in jax.tree_util.tree_leaves(model) if not eqx.is_array(leaf)}
    assert {bool, float} <= kinds and any(callable(k) for k in kinds)  # flags, dropout p, gelu
    # peak_bytes differentiates what eqx.filter_value_and_grad does: its step under jax.jit
    # (eqx.filter_jit adds a scalar marker output) peaks exactly there.
    arrays, static = eqx.partition(model, eqx.is_array)
    step = jax.jit(lambda arrays, x, y: eqx.filter_value_and_grad(eqx_loss)(eqx.combine(arrays, static), x, y))
    assert memory_of(step.lower(arrays, x, y).compile()) == plain


@pytest.mark.parametrize("frac", FRACTIONS)
def test_equinox_gpt(eqx_case, frac):
    eqx, model, x, y, plain, reference = eqx_case
    budget = int(plain * frac)
    step = remat_opt.optimize(eqx_loss, budget, solver_options=FAST, max_attempts=ATTEMPTS)
    plan = step.plan(model, x, y)
    assert plan.plain_peak_bytes == plain
    assert plan.measured_peak_bytes <= budget, str(plan)
    assert plan.status in ("OPTIMAL", "FEASIBLE"), str(plan)
    # The usual step, compiled afresh: eqx.filter_jit's own overhead (its marker output) is
    # the same as for the plain step, and the values and gradients are the plain step's.
    compiled = eqx.filter_jit(eqx.filter_value_and_grad(step)).lower(model, x, y).compile()
    overhead = memory_of(reference.compiled) - plain
    assert memory_of(compiled.compiled) == plan.measured_peak_bytes + overhead
    assert_tree_close(compiled(model, x, y), reference(model, x, y))
