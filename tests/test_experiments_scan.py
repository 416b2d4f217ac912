"""The scan experiment scripts, reduced, so that they cannot rot: run as a user would (a file of
their own, so that the test workers can share the experiment scripts' minutes)."""

import pytest
from experiment_scripts import read_rows, run_script

pytestmark = pytest.mark.scripts  # runs an experiment script as a user would


def test_scan_quick(tmp_path):
    # A 4-layer scan GPT: the hand-written checkpoints of the loop (as written, nothing_saveable,
    # dots_saveable), then remat_opt at the tightest budget; the script exits non-zero if remat_opt
    # misses it or recomputes more than the best hand-written plan that fits.
    out = run_script("scan.py", "--quick", "--layers", "4", "--out", str(tmp_path))
    assert "recomputes no more than the best fitting hand-written alternative" in out
    rows = read_rows(tmp_path / "scan_quick.csv")
    ours = [r for r in rows if r["strategy"] == "remat_opt"]
    assert len(ours) == 1
    assert {"body nothing_saveable", "body dots_saveable, 2 groups"} <= {r["strategy"] for r in rows}


def test_libraries_quick(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    # The user's own checkpoint of each library on a 2-layer GPT's scanned block, saving nothing
    # (Flax: nn.scan of nn.remat(block); Equinox: eqx.filter_checkpoint on the scan body), then
    # remat_opt asked for its XLA peak (no --fractions), the scan kept whole. The script exits
    # non-zero if remat_opt misses the budget, its gradients or an alternative's differ from the
    # library's plain step, or it recomputes more than the best hand-written alternative that fits.
    out = run_script("libraries.py", "--quick", "--layers", "2", "--d-model", "32", "--fractions",
                     "--out", str(tmp_path))
    assert "every budget met, gradients equal the library's plain step" in out
    rows = read_rows(tmp_path / "libraries.csv")
    for library, alternative in (("flax", "nn.remat(nothing_saveable)"),
                                 ("equinox", "filter_checkpoint(nothing_saveable) body")):
        plain = next(r for r in rows if r["library"] == library and r["strategy"] == "no remat")
        theirs = next(r for r in rows if r["library"] == library and r["strategy"] == alternative)
        (ours,) = [r for r in rows if r["library"] == library and r["strategy"] == "remat_opt"]
        assert 0 < int(theirs["recompute_flops"]) and int(theirs["measured_peak_bytes"]) < int(plain["measured_peak_bytes"])
        assert ours["budget_bytes"] == theirs["measured_peak_bytes"], (ours, theirs)
        assert int(ours["measured_peak_bytes"]) <= int(ours["budget_bytes"])
        assert int(ours["recompute_flops"]) <= int(theirs["recompute_flops"]), (ours, theirs)
