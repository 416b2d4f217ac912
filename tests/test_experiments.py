"""The experiment scripts, reduced, so that they cannot rot: run as a user would."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXPERIMENTS / script), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_pareto_and_fidelity_quick(tmp_path):
    out = _run("pareto.py", "--quick", "--out", str(tmp_path))
    assert "reproduce: python" in out and "jax " in out
    rows = _rows(tmp_path / "pareto.csv")
    assert {r["model"] for r in rows} == {"mlp", "gpt"}
    ours = [r for r in rows if r["strategy"] == "remat_opt" and not r["error"]]
    assert ours, "remat_opt produced no plan"
    for r in ours:  # every plan remat_opt returned fits its budget on XLA
        assert int(r["measured_peak_bytes"]) <= int(r["budget_bytes"])
    assert any(r["kind"] == "baseline" and r["strategy"] == "chen_greedy" for r in rows)
    assert (tmp_path / "pareto.png").stat().st_size > 0
    assert _rows(tmp_path / "pareto_dominance.csv")

    report = _run("fidelity.py", "--csv", str(tmp_path / "pareto.csv"))
    assert "max |relative error|" in report
    points = _rows(tmp_path / "fidelity.csv")
    assert len(points) >= len(ours)


def test_scan_quick(tmp_path):
    # A 4-layer scan GPT: the hand-written checkpoints of the loop (as written, nothing_saveable,
    # dots_saveable), then remat_opt at the tightest budget; the script exits non-zero if remat_opt
    # misses it or recomputes more than the best hand-written plan that fits.
    out = _run("scan.py", "--quick", "--layers", "4", "--out", str(tmp_path))
    assert "recomputes no more than the best fitting hand-written alternative" in out
    rows = _rows(tmp_path / "scan_quick.csv")
    ours = [r for r in rows if r["strategy"] == "remat_opt"]
    assert len(ours) == 1
    assert {"body nothing_saveable", "body dots_saveable, 2 groups"} <= {r["strategy"] for r in rows}


def test_libraries_quick(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    # Every hand-written checkpoint of each library on a 2-layer GPT, then remat_opt at 0.6 of
    # the plain peak; the script exits non-zero if remat_opt misses the budget or recomputes
    # more than the best hand-written alternative that fits.
    out = _run("libraries.py", "--quick", "--layers", "2", "--d-model", "32", "--fractions", "0.6",
               "--out", str(tmp_path))
    assert "every budget met, gradients equal the library's plain step" in out
    rows = _rows(tmp_path / "libraries.csv")
    assert {r["library"] for r in rows if r["strategy"] == "remat_opt"} == {"flax", "equinox"}
    assert {"nn.remat(nothing_saveable)", "filter_checkpoint(nothing_saveable) body"} <= {r["strategy"] for r in rows}


def test_deep_chain_quick(tmp_path):
    # A 16-layer chain: Chen, Revolve and remat_opt at remat_opt's lowest budget and each
    # baseline's peak; the script exits non-zero if remat_opt misses a budget or loses.
    out = _run("deep_chain.py", "--depth", "16", "--width", "64", "--batch", "256", "--quick",
               "--out", str(tmp_path))
    assert "every budget met; at each baseline's peak remat_opt recomputes no more" in out
    strategies = {r["strategy"] for r in _rows(tmp_path / "deep_chain.csv")}
    assert strategies == {"chen_sqrt_n", "chen_greedy", "revolve", "remat_opt"}


def test_loop_fidelity_quick(tmp_path):
    out = _run("loop_fidelity.py", "--quick", "--out", str(tmp_path))
    assert "reproduce: python" in out
    rows = _rows(tmp_path / "loop_fidelity.csv")
    assert len(rows) == 8  # 2 groups (4 layers) x 5 bodies, less the program as written twice
    for r in rows:
        assert int(r["measured_peak_bytes"]) > 0 and int(r["predicted_peak_bytes"]) > 0
    # Charging a rematerializing body's rerun brings the worst plan closer to XLA.
    assert max(abs(float(r["error"])) for r in rows) < max(abs(float(r["error_without_rerun"])) for r in rows)


def test_schedule_fidelity_holds_on_the_measured_schedules():
    """The memory model re-predicts the committed set of XLA-measured schedules
    (Chen's, Revolve's and CP-SAT's on the zoo models) within 5% but for a few:
    a model change that breaks it shows here, not in a sweep. Measured: 109 of
    117 within 5%, -5.5% .. +10.6% at the commit that added it; 113 of 117,
    -5.0% .. +6.3% once saved names were laid over gradient slots and nested
    segments held their cotangents through their last segment."""
    sys.path.insert(0, str(EXPERIMENTS))
    import schedule_fidelity
    from common import read_csv

    rows = read_csv(schedule_fidelity.CSV)
    assert {r["model"] for r in rows} == {"gpt", "mlp", "resnet", "unet"} and len(rows) > 100
    checked = schedule_fidelity.check(rows)
    errors = [r["relative_error"] for r in checked]
    assert -0.06 <= min(errors) and max(errors) <= 0.07, schedule_fidelity.summary(checked)
    assert sum(abs(e) <= 0.05 for e in errors) >= 0.95 * len(errors), schedule_fidelity.summary(checked)
    assert "all " in schedule_fidelity.summary(checked)
