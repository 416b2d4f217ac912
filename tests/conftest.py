"""Shared fixtures: small programs whose gradients and XLA peaks are cheap to check."""

import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import pytest

from remat_opt.zoo import MODELS, GPTConfig

# One run's XLA compilations (per xdist worker), cached on disk for the rest of the run
# (and for the experiment scripts it starts, through the environment): tests measure the same
# programs many times over, and compiling them is most of the suite's time. A
# cached executable is the one compiled (memory_analysis() reads the same); the
# folder is new every run, so nothing carries over from another jax or remat_opt.
_CACHE = tempfile.mkdtemp(prefix="remat_opt_tests_xla_")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


# Plans kept on disk (optimize(..., cache=True), the default) go to a folder of this run
# too, never to the user's ~/.cache/remat_opt; each test gets its own subfolder, so a test
# plans afresh and never loads a plan another test made (some monkeypatch the search).
_PLANS = tempfile.mkdtemp(prefix="remat_opt_tests_plans_")
os.environ["REMAT_OPT_CACHE_DIR"] = _PLANS


@pytest.fixture(autouse=True)
def _plan_cache_per_test(request, monkeypatch):
    monkeypatch.setenv("REMAT_OPT_CACHE_DIR", tempfile.mkdtemp(prefix="test_", dir=_PLANS))


# The files that take longest, longest first (one xdist worker each, `--dist loadfile`); the rest
# follow in their usual order. pytest-xdist hands a worker its next file when it has two tests
# left, in collection order (pyproject.toml turns off its reordering by test count, which sent
# the files of one or two long tests last): a long file started last leaves the other worker
# idle until it ends, and short files at the end fill the two workers evenly. Rough order, from
# `--durations` of a run on two shared cores; a file missing here only runs later.
LONGEST_FIRST = (
    "test_libraries.py", "test_step_time_limits.py", "test_solve.py", "test_optimize.py",
    "test_optimize_budget_errors.py", "test_programs_features.py", "test_step_time.py", "test_programs.py",
    "test_scan_body.py", "test_library_scan.py", "test_step.py", "test_baselines.py", "test_manual.py",
    "test_spmd.py", "test_spmd_shard_map.py", "test_fuzz.py", "test_library_remat.py", "test_heldout.py",
    "test_policy_plans.py", "test_known.py", "test_time_saves.py", "test_nesting.py", "test_scan_baselines.py",
    "test_counted.py", "test_experiments.py", "test_refusals.py", "test_libraries_equinox.py", "test_outside.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)
    shutil.rmtree(_PLANS, ignore_errors=True)


def tanh_mlp(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


@pytest.fixture
def small_mlp():
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8 for i in range(6)]
    x = jax.random.normal(key, (1024, 64))
    return tanh_mlp, params, x


@pytest.fixture(scope="session")
def small_gpt():
    spec = MODELS["gpt"]
    config = GPTConfig(num_layers=3, d_model=64, num_heads=2, seq_len=64, batch=2, vocab=64)
    params, batch = spec.init(config, jax.random.PRNGKey(0))
    return spec.loss, params, batch


