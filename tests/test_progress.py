"""Progress while a plan takes its time: a line rewritten on a terminal, log records otherwise,
nothing when asked (REMAT_OPT_PROGRESS=0) or under pytest by default, nothing for a quick plan."""

import io
import logging

import pytest

import remat_opt
from remat_opt.planner import _progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_terminal_line_shows_stage_candidate_and_best_after_a_few_seconds():
    clock, stream = Clock(), io.StringIO()
    progress = _progress.Progress("loss under 1.00 MiB", 1 << 20, stream, clock)
    progress.stage("CP-SAT solve 2/4")
    progress.measured(3 << 20)
    progress.draw()
    assert stream.getvalue() == ""  # a quick plan shows nothing
    clock.now += _progress.DELAY_S
    progress.measured(1 << 19)
    progress.draw()
    assert stream.getvalue() == ("\rremat_opt: loss under 1.00 MiB · CP-SAT solve 2/4 · 2 compiled, lowest peak "
                                 "512.00 KiB (fits) · 3 s\x1b[K")
    progress.close()
    assert stream.getvalue().endswith("\r\x1b[K")  # cleared: the caller prints what came of the plan


def _plan_small(small_mlp):
    fn, params, x = small_mlp
    budget = int(remat_opt.peak_bytes(fn, params, x) * 0.85)
    return remat_opt.optimize(fn, budget, cache=False).plan(params, x)


def test_a_plan_logs_its_stages_and_measurements_where_stderr_is_no_terminal(small_mlp, monkeypatch, caplog):
    monkeypatch.setenv(_progress.ENV, "1")  # shown under pytest too
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)  # as if the plan took its time
    with caplog.at_level(logging.INFO, logger="remat_opt.progress"):
        plan = _plan_small(small_mlp)
    lines = [r.getMessage() for r in caplog.records if r.name == "remat_opt.progress"]
    assert any("CP-SAT solve 1/" in line for line in lines) and any("compiled, lowest peak" in line for line in lines)
    assert lines[-1].startswith("remat_opt: tanh_mlp under ") and lines[-1].endswith(": done")
    # The best so far is the lowest peak XLA measured: at most the plan's (its program was measured too).
    best = lines[-1].split("lowest peak ")[1].split(" (")[0]
    assert remat_opt.parse_bytes(best.replace(" ", "")) <= plan.measured_peak_bytes * 1.005  # 2 decimals shown


@pytest.mark.parametrize("setting", [None, "0"])
def test_silent_when_asked_and_under_pytest(small_mlp, monkeypatch, caplog, setting):
    if setting is None:
        monkeypatch.delenv(_progress.ENV, raising=False)  # PYTEST_CURRENT_TEST is set: silent by default
    else:
        monkeypatch.setenv(_progress.ENV, setting)
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="remat_opt.progress"):
        _plan_small(small_mlp)
    assert not [r for r in caplog.records if r.name == "remat_opt.progress"]
