"""``experiments/pareto.py --quick`` on the MLP, then ``fidelity.py`` on its output (and re-predicted), run as a user would.

The script's path is the same for every model; the GPT's plans are checked on
XLA by many other tests, so this one runs the cheaper model only.
"""

import pytest
from experiment_scripts import read_rows, run_script

pytestmark = pytest.mark.scripts  # runs an experiment script as a user would


def test_pareto_and_fidelity_quick(tmp_path):
    out = run_script("pareto.py", "--quick", "--models", "mlp", "--out", str(tmp_path))
    assert "reproduce: python" in out and "jax " in out
    rows = read_rows(tmp_path / "pareto.csv")
    assert {r["model"] for r in rows} == {"mlp"}
    ours = [r for r in rows if r["strategy"] == "remat_opt" and not r["error"]]
    assert ours, "remat_opt produced no plan"
    for r in ours:  # every plan remat_opt returned fits its budget on XLA
        assert int(r["measured_peak_bytes"]) <= int(r["budget_bytes"])
    assert any(r["kind"] == "baseline" and r["strategy"] == "chen_greedy" for r in rows)
    assert (tmp_path / "pareto.png").stat().st_size > 0
    assert read_rows(tmp_path / "pareto_dominance.csv")

    # fidelity.py on the sweep, with its stored schedules predicted again by the same model:
    # they give the sweep's predictions back.
    assert all(r["schedule"] for r in ours)
    report = run_script("fidelity.py", "--csv", str(tmp_path / "pareto.csv"), "--repredict",
                        "--out", str(tmp_path / "re"))
    assert "max |relative error|" in report
    points = read_rows(tmp_path / "re" / "fidelity.csv")
    again = [p for p in points if p["sweep_predicted_peak_bytes"]]
    assert len(points) >= len(again) >= len(ours)
    assert all(p["predicted_peak_bytes"] == p["sweep_predicted_peak_bytes"] for p in again)
