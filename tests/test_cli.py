"""The command line, run as a user runs it: a subprocess, its exit code and output."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remat_opt import peak_bytes
from remat_opt._cli import main

HERE = Path(__file__).parent


def remat_opt_cli(*argv, cache):
    """``python -m remat_opt ARGV`` from the tests folder (where cli_program.py is)."""
    env = {**os.environ, "REMAT_OPT_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "remat_opt", *argv], cwd=HERE, env=env, check=False,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plain_peak():
    sys.path.insert(0, str(HERE))
    try:
        import cli_program
    finally:
        sys.path.remove(str(HERE))
    return peak_bytes(cli_program.loss, *cli_program.example_args())


def test_help_everywhere(tmp_path, capsys):
    run = remat_opt_cli("--help", cache=tmp_path)
    assert run.returncode == 0 and "usage: remat-opt" in run.stdout, run.stderr
    for command in ("peak", "plan", "demo", "cache"):  # the same parser, in this process
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0 and f"usage: remat-opt {command}" in capsys.readouterr().out
    script = shutil.which("remat-opt")  # the console script, where the package is installed
    if script is not None:
        assert subprocess.run([script, "--help"], check=False, capture_output=True,
                              timeout=120).returncode == 0


def test_peak_prints_the_plain_peak_to_choose_a_budget(plain_peak, tmp_path):
    run = remat_opt_cli("peak", "cli_program:loss", "--args", "cli_program:example_args", "--json", cache=tmp_path)
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["plain_peak_bytes"] == plain_peak  # remat_opt.peak_bytes, in this process
    assert 0 < figures["arguments_and_outputs_bytes"] < plain_peak
    text = remat_opt_cli("peak", "cli_program:loss", "--args", "cli_program:example_args", cache=tmp_path)
    assert text.returncode == 0 and f"({plain_peak:,} bytes)" in text.stdout and "0.6x" in text.stdout


def test_plan_then_list_and_clear_the_cache(plain_peak, tmp_path):
    budget = int(0.85 * plain_peak)
    run = remat_opt_cli("plan", "cli_program:loss", "--args", "cli_program:example_args", "--budget", "0.85x",
                        "--json", cache=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"budget 0.85x of the plain peak" in run.stderr  # a share of the plain peak, said in bytes
    plan = json.loads(run.stdout)
    # XLA's figures, as this process measures them, and a plan under the budget.
    assert plan["plain_peak_bytes"] == plain_peak and plan["measured_peak_bytes"] <= budget == plan["budget_bytes"]
    assert plan["fits"] and plan["num_segments"] == len(plan["schedule"]["cuts"]) + 1
    listed = json.loads(remat_opt_cli("cache", "list", "--json", cache=tmp_path).stdout)
    (entry,) = listed["entries"]
    assert listed["directory"] == str(tmp_path) and entry["valid"] == "ok"
    assert entry["function"] == "cli_program.loss" and entry["measured_peak_bytes"] == plan["measured_peak_bytes"]
    # The same plan again, read from the cache: the text report this time.
    again = remat_opt_cli("plan", "cli_program:loss", "--args", "cli_program:example_args", "--budget", str(budget),
                          "--report", cache=tmp_path)
    assert again.returncode == 0 and "segment 0: positions" in again.stdout and "cli_program.py:" in again.stdout
    cleared = remat_opt_cli("cache", "clear", cache=tmp_path)
    assert cleared.returncode == 0 and "removed 1 cached plan(s)" in cleared.stdout
    assert json.loads(remat_opt_cli("cache", "list", "--json", cache=tmp_path).stdout)["entries"] == []


@pytest.mark.parametrize("argv, message", [
    (["plan", "cli_program", "--args", "cli_program:example_args", "--budget", "1GiB"], "MODULE:NAME"),
    (["plan", "no_such_module:loss", "--args", "cli_program:example_args", "--budget", "1GiB"], "cannot import"),
    (["plan", "cli_program:nope", "--args", "cli_program:example_args", "--budget", "1GiB"], "no attribute"),
    (["plan", "cli_program:loss", "--args", "cli_program:not_a_tuple", "--budget", "1GiB"], "tuple"),
    (["plan", "cli_program:loss", "--args", "cli_program:example_args", "--budget", "2G"], "--budget"),
    (["plan", "cli_program:loss", "--budget", "1GiB"], "--args"),
    (["plan", "cli_program:loss", "--args", "cli_program:example_args", "--budget", "0x"], "0.6x"),
    (["plan", "cli_program:loss", "--args", "cli_program:example_args", "--budget", "halfx"], "0.6x"),
    (["peak", "cli_program:loss"], "--args"),
    (["cache", "drop"], "invalid choice"),
    (["train"], "invalid choice"),
])
def test_usage_errors_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(HERE)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_usage_error_exits_2_from_the_shell(tmp_path):
    run = remat_opt_cli("plan", "cli_program:loss", "--budget", "lots", "--args", "cli_program:example_args",
                        cache=tmp_path)
    assert run.returncode == 2 and "--budget" in run.stderr and run.stdout == ""


def test_a_remat_opt_error_exits_1_with_its_message(tmp_path):
    run = remat_opt_cli("plan", "cli_program:while_loss", "--args", "cli_program:example_args", "--budget", "1MiB",
                        "--no-cache", cache=tmp_path)
    assert run.returncode == 1 and run.stdout == ""
    assert "UnsupportedProgramError" in run.stderr and "while_loop" in run.stderr and "Traceback" not in run.stderr


def test_demo_runs_a_zoo_model(tmp_path):
    # Above the plain peak: the demo's whole path (plain peak, plan, row) without a solve.
    run = remat_opt_cli("demo", "--model", "mlp", "--fractions", "1.1", cache=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "plain gradient step peak (XLA)" in run.stdout and "PLAIN" in run.stdout


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`remat-opt cache list --json | head`: the reader closes the pipe before the listing is written."""
    for i in range(3):  # something to list
        (tmp_path / f"{i:064x}.json").write_text("{}")
    env = {**os.environ, "REMAT_OPT_CACHE_DIR": str(tmp_path)}
    with subprocess.Popen([sys.executable, "-m", "remat_opt", "cache", "list", "--json"], cwd=HERE, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # `head` has read its lines and gone
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == 141 and "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
