"""Scanned decoders written with Flax Linen, Flax NNX and Equinox, against MaxText's recipes.

Each held-out scanned decoder of ``experiments/heldout_scan_programs.py``
(``nn.scan``; ``nnx.scan`` over ``nnx.vmap``-built layers; ``lax.scan`` over
``eqx.filter_vmap``-stacked layers, projections tagged with MaxText's
``checkpoint_name``s), small: every MaxText recipe applied as the library's
own per-layer remat is measured on XLA, and remat_opt, asked for the budget
halfway between the lowest recipe peak and the plain peak, must fit it on
XLA, give the plain step's gradients, and recompute no more than the best
recipe that fits. ``experiments/library_scan.py`` runs the same comparison at
12 layers and five budgets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import remat_opt
from remat_opt.baselines import RECIPES
from remat_opt.memory import gradient_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from heldout_scan_programs import LIBRARIES, SCAN_PROGRAMS, Sizes, gradients

SIZES = Sizes(layers=4, d_model=32, heads=4, seq=16, batch=2, vocab=64)
FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=2, seed=0)


# Each case is about 16 compiles and a scan-body search: minutes on 2 shared cores. CI runs
# Equinox's; the Flax decoders (Linen and NNX trace to the same program) run with `-m slow`,
# and at 12 layers in experiments/library_scan.py.
CASES = [pytest.param(name, marks=[] if name == "equinox_scan" else [pytest.mark.slow]) for name in SCAN_PROGRAMS]


@pytest.mark.parametrize("name", CASES)
def test_scanned_decoder_fits_with_no_more_recompute_than_the_best_recipe(name):
    pytest.importorskip(LIBRARIES[name])
    program = SCAN_PROGRAMS[name](SIZES)
    base = gradient_flops(program.loss, program.args, {}, program.argnums)
    plain = remat_opt.peak_bytes(program.loss, *program.args, argnums=program.argnums)
    menu = {}
    for recipe in RECIPES:
        variant = SCAN_PROGRAMS[name](SIZES, recipe)
        menu[recipe] = (remat_opt.peak_bytes(variant.loss, *variant.args, argnums=variant.argnums),
                        gradient_flops(variant.loss, variant.args, {}, variant.argnums) - base)
    # The recipes are what they claim: saving nothing recomputes the most, saving every name the least.
    assert menu["full"][1] > menu["minimal_with_context"][1] > 0, menu
    low = min(peak for peak, _ in menu.values())
    assert low < plain, menu
    budget = (low + plain) // 2
    best = min(recompute for peak, recompute in menu.values() if peak <= budget)

    step = remat_opt.optimize(program.loss, budget, argnums=program.argnums, unroll_scans=0, solver_options=FAST,
                             cache=False)
    plan = step.plan(*program.args)
    assert plan.measured_peak_bytes <= budget, str(plan)
    assert plan.measured_recompute_flops <= best, (str(plan), best, menu)
    for got, want in zip(gradients(program, step), gradients(program), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
