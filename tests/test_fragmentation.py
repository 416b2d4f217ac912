"""Fragmentation at XLA's peak: the bytes live there (XLA's live-range dump)
against the bytes it allocated (``memory_analysis()``)."""

import jax.numpy as jnp

import remat_opt
from remat_opt.memory._fragmentation import live_at_peak

# A live-range dump as XLA:CPU (jax 0.10) wrote it for the gradient of
# sum(tanh(x @ w)), cut to the peak section and what follows it.
_DUMP = """HloLiveRange (max 11):
  BufferLiveRange:
    x.1{}:0-11
    w.1{}:0-11
  Live ranges at 8 (peak):
    dot{}: 16384 bytes (cumulative: 16384 bytes)
    w.1{}: 16384 bytes (cumulative: 32768 bytes)
    multiply_add_fusion{}: 8192 bytes (cumulative: 40960 bytes)
    x.1{}: 8192 bytes (cumulative: 49152 bytes)
    wrapped_reduce-window{}: 8 bytes (cumulative: 49160 bytes)
    constant.5{}: 4 bytes (cumulative: 49164 bytes)
  Stack trace breakdown for peak usage: 49 164 bytes
    main.2 (100.0%, total: 49 164 bytes, current: 0 bytes, remaining: 49 164 bytes)
"""


def test_live_at_peak_reads_the_peak_section_only():
    buffers = live_at_peak(_DUMP)
    assert [name for name, _ in buffers] == ["dot{}", "w.1{}", "multiply_add_fusion{}", "x.1{}",
                                             "wrapped_reduce-window{}", "constant.5{}"]
    assert sum(b for _, b in buffers) == 16384 + 16384 + 8192 + 8192 + 8 + 4  # XLA's cumulative total
    assert live_at_peak("HloLiveRange (max 1):\n  BufferLiveRange:\n") is None


def test_fragmentation_of_a_program_counted_by_hand():
    # The gradient of sum(sin(w)) is cos(w): at its end the step holds w, the
    # gradient (4 KiB each) and the loss (4 bytes), whatever partial sums the
    # reduction keeps beside them.
    n = 1024
    fn = lambda w: jnp.sum(jnp.sin(w))
    w = jnp.ones(n, jnp.float32)
    found = remat_opt.fragmentation(fn, w)
    by_hand = 4 * n + 4 * n + 4
    assert by_hand <= found.live_bytes <= by_hand + 512
    assert sorted(b for _, b in found.buffers if b == 4 * n) == [4 * n, 4 * n]
    assert found.live_bytes == sum(b for _, b in found.buffers)
    assert found.allocated_bytes == remat_opt.peak_bytes(fn, w)
    assert found.live_bytes <= found.allocated_bytes
    assert found.gap_bytes == found.allocated_bytes - found.live_bytes


def test_fragmentation_of_an_optimized_function_in_its_report():
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x * x)

    ws = [jnp.full((32, 32), 0.01 * (i + 1), jnp.float32) for i in range(6)]
    x = jnp.ones((512, 32), jnp.float32)
    plain = remat_opt.peak_bytes(loss, ws, x)
    step = remat_opt.optimize(loss, int(0.8 * plain), solver_options=remat_opt.SolverOptions(
        time_limit_s=5, deterministic_time_limit=2, num_workers=1), cache=False)
    plan = step.plan(ws, x)
    found = remat_opt.fragmentation(step, ws, x)
    # The optimized function's step is the plan's: XLA allocates what the plan measured.
    assert found.allocated_bytes == plan.measured_peak_bytes
    assert 0 < found.live_bytes <= found.allocated_bytes
    text = plan.report(found)
    assert text.splitlines()[1] == f"fragmentation: {found}"
    assert "fragmentation:" not in plan.report()
