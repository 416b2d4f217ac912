"""The held-out programs (experiments/heldout_programs.py) and their script, kept from rotting.

Every registered program builds, its gradient step compiles and runs to
finite values, and its plain peak is in the intended range; the script runs
one small random program at one budget and writes the rows it should, each
plan fitting its budget on XLA. Nothing here checks the model's predictions:
the held-out set measures them, it does not gate on them.
"""

import importlib.util
import math
import sys

import jax
import pytest
from experiment_scripts import EXPERIMENTS, read_rows, run_script

import remat_opt

sys.path.insert(0, str(EXPERIMENTS))
from heldout_programs import LIBRARIES, PEAK_RANGE, PROGRAMS  # noqa: E402

QUICK_PROGRAM = "random2"


def _gradient_step(program):
    """The plain step, compiled: jax.value_and_grad, or Equinox's filtered one when leaves are static."""
    leaves = jax.tree.leaves(program.args)
    if all(isinstance(leaf, jax.Array) for leaf in leaves):
        return jax.jit(jax.value_and_grad(program.loss, argnums=program.argnums))
    import equinox as eqx

    return eqx.filter_jit(eqx.filter_value_and_grad(program.loss))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_builds_differentiates_and_peaks_in_range(name):
    library = LIBRARIES.get(name)
    if library is not None and importlib.util.find_spec(library.split(".")[0]) is None:
        pytest.skip(f"{library} is not installed")
    program = PROGRAMS[name]()
    assert program.description
    value, grads = _gradient_step(program)(*program.args)
    assert math.isfinite(float(value))
    assert all(bool(jax.numpy.all(jax.numpy.isfinite(g))) for g in jax.tree.leaves(grads) if hasattr(g, "dtype"))
    assert any(bool(jax.numpy.any(g != 0)) for g in jax.tree.leaves(grads) if hasattr(g, "dtype"))
    peak = remat_opt.peak_bytes(program.loss, *program.args, argnums=program.argnums)
    assert PEAK_RANGE[0] <= peak <= PEAK_RANGE[1], f"{name}: plain peak {peak / 2**20:.2f} MiB"


def test_programs_are_fixed():
    # The same factory builds the same program: the random ones are their seeds' (same description,
    # same parameter values).
    a, b = PROGRAMS[QUICK_PROGRAM](), PROGRAMS[QUICK_PROGRAM]()
    assert a.description == b.description
    for x, y in zip(jax.tree.leaves(a.args), jax.tree.leaves(b.args), strict=True):
        assert bool(jax.numpy.array_equal(x, y))
    assert len([n for n in PROGRAMS if n.startswith("random")]) >= 8


@pytest.mark.scripts
def test_heldout_quick(tmp_path):
    out = run_script("heldout.py", "--quick", "--programs", QUICK_PROGRAM, "--label", "test", "--out", str(tmp_path))
    assert "within 5%" in out and "reproduce: python" in out
    rows = read_rows(tmp_path / "heldout_quick.csv")
    assert {(r["kind"], r["strategy"]) for r in rows} == {
        ("plain", "no_remat"), ("schedule", "chen_sqrt_n"), ("schedule", "chen_greedy"), ("schedule", "revolve"),
        *(("policy", f"checkpoint/{p}") for p in remat_opt.POLICIES), ("plan", "remat_opt")}
    assert len(rows) == 1 + 3 + len(remat_opt.POLICIES) + 1
    assert {r["program"] for r in rows} == {QUICK_PROGRAM} and {r["label"] for r in rows} == {"test"}
    assert not any(r["exception"] for r in rows)
    for r in rows:
        if r["kind"] in ("plain", "schedule"):
            assert float(r["error"]) == pytest.approx(int(r["predicted_peak_bytes"]) / int(r["measured_peak_bytes"]) - 1)
    plans = [r for r in rows if r["kind"] == "plan"]
    assert [float(r["budget_fraction"]) for r in plans] == [0.6]
    for r in plans:
        assert r["fits"] == "True" and int(r["measured_peak_bytes"]) <= int(r["budget_bytes"])
        assert 0 <= float(r["recompute_fraction"]) < 1


@pytest.mark.scripts
def test_device_check_runs_on_the_backend_at_hand(tmp_path):
    # experiments/device_check.py is run where a GPU is lent, rarely: kept from rotting here, on the CPU.
    out = run_script("device_check.py", "--programs", "zoo_mlp", "--fractions", "0.8", "--schedules",
                     "chen_sqrt_n", "--policies", "dots_saveable", "--buffers", "--out", str(tmp_path))
    assert "device cpu" in out
    rows = read_rows(tmp_path / "device_check.csv")
    assert [(r["kind"], r["strategy"]) for r in rows] == [
        ("plain", "no_remat"), ("schedule", "chen_sqrt_n"), ("policy", "checkpoint/dots_saveable"),
        ("plan", "remat_opt")]
    plan = rows[-1]
    assert plan["fits"] == "True" and int(plan["measured_peak_bytes"]) <= int(plan["budget_bytes"])
    assert float(plan["grad_error_over_tolerance"]) <= 1  # gradients equal the plain step's on XLA:CPU
    assert float(plan["step_ms"]) > 0 and float(plan["plain_step_ms"]) == float(rows[0]["step_ms"]) > 0
    buffers = (tmp_path / "device_check_buffers.txt").read_text()
    assert "== zoo_mlp plain\n" in buffers and "== zoo_mlp plan at 0.8\n" in buffers
    assert " MiB  allocation " in buffers and " MiB  value: " in buffers
