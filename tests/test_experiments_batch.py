"""``experiments/batch_size.py --quick``: it runs, writes its table, and remat_opt fits the most.

The script searches the largest batch each strategy fits in a fixed memory,
with XLA's measured peak as the judge for every strategy; remat_opt's answer
is checked here against the baselines' (no_remat and Chen's sqrt(n)), which
are measured independently of its solver.
"""

import pytest
from experiment_scripts import read_rows, run_script

pytestmark = pytest.mark.scripts  # runs an experiment script as a user would


def test_batch_size_quick(tmp_path):
    # Batches in steps of 64 (half the config's batch): remat_opt's probes are plans, and each
    # refused one costs more than one that fits; 64 still tells the three strategies apart
    # (128, 192, 256). About 30 s on two idle cores.
    out = run_script("batch_size.py", "--quick", "--batch-step", "64", "--out", str(tmp_path))
    assert "Reproduce: python experiments/batch_size.py --quick" in out

    rows = read_rows(tmp_path / "batch_size.quick.csv")
    assert rows, out
    assert (tmp_path / "batch_size.quick.png").stat().st_size > 0
    assert (tmp_path / "batch_size.quick.probes.csv").stat().st_size > 0
    assert all(r["jax_version"] and r["machine"] for r in rows)

    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["strategy"]] = r
    for model, strategies in by_model.items():
        assert {"no_remat", "remat_opt"} <= set(strategies), strategies
        memory = int(strategies["no_remat"]["memory_bytes"])
        remat = strategies["remat_opt"]
        # The default memory is the plain program's peak at the config's batch: it fits there.
        assert int(strategies["no_remat"]["max_batch"]) >= 1
        for name, r in strategies.items():
            # Every reported batch was measured within the memory by XLA.
            if int(r["max_batch"]) > 0:
                assert int(r["peak_bytes"]) <= memory, (model, name, r)
            assert int(remat["max_batch"]) >= int(r["max_batch"]), (model, name, rows)
        # At the plain program's own peak, rematerializing fits a larger batch.
        assert int(remat["max_batch"]) > int(strategies["no_remat"]["max_batch"]), rows
