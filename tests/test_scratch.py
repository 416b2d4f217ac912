"""What XLA holds while it transposes one equation (memory/_scratch.py): read
off the plain program's compile, and the prediction of fenced schedules of
conv nets against XLA's peak."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_opt._schedule import Schedule
from remat_opt.baselines import BaselineCall, reference
from remat_opt.memory import simulate
from remat_opt.memory._scratch import transpose_scratch
from remat_opt.memory import calibrate
from remat_opt.rewrite import apply_schedule

BATCH, SIZE, WIDTH = 4, 32, 16


def _conv(x, w, layout):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=layout)


def pooled_net(params, x):
    """NHWC convolutions around a 3x3 max pool."""
    layout = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(_conv(x, params[0], layout))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    for w in params[1:]:
        h = h + jnp.tanh(_conv(h, w, layout))
    return jnp.mean(h**2)


def nchw_net(params, x):
    """A residual stack of NCHW/OIHW convolutions: XLA:CPU transposes them in NHWC."""
    layout = ("NCHW", "OIHW", "NCHW")
    h = _conv(x, params[0], layout)
    for w in params[1:]:
        h = h + jax.nn.silu(_conv(h, w, layout))
    return jnp.mean(h**2)


def _args(layout_nchw: bool):
    rng = np.random.default_rng(7)
    shape = (3, 3, WIDTH, WIDTH) if not layout_nchw else (WIDTH, WIDTH, 3, 3)
    first = (3, 3, 3, WIDTH) if not layout_nchw else (WIDTH, 3, 3, 3)
    params = [jnp.asarray(rng.normal(size=first) / 5, jnp.float32)]
    params += [jnp.asarray(rng.normal(size=shape) / 12, jnp.float32) for _ in range(6)]
    x = rng.normal(size=(BATCH, 3, SIZE, SIZE) if layout_nchw else (BATCH, SIZE, SIZE, 3))
    return params, jnp.asarray(x, jnp.float32)


def _eqn_of(fn, args, primitive):
    return [i for i, e in enumerate(jax.make_jaxpr(fn)(*args).eqns) if e.primitive.name == primitive]


def test_max_pooling_index_search_is_read_as_scratch_of_its_forward_part():
    """XLA:CPU finds the pool's maxima with index buffers of the padded input;
    they read forward values only, so they count as the transpose's forward part."""
    args = _args(False)
    ref = reference(BaselineCall(pooled_net, args, budget_bytes=1 << 40))
    pool = _eqn_of(pooled_net, args, "reduce_window_max")
    (unit,) = [u.index for u in ref.graph.units if u.position in pool and u.primitive == "reduce_window_max"]
    backward, forward, held = ref.graph.scratch[unit]
    pooled_input = BATCH * SIZE * SIZE * WIDTH * 4
    assert forward >= pooled_input  # the padded input alone is larger
    # Of it, the backward proper reads a buffer of the padded input's shape (it scatters into it);
    # not the index search's intermediates, which die in the forward.
    assert pooled_input <= held < forward
    pool_units = {u.index for u in ref.graph.units if u.position in pool}
    # Held once: not again by the pool's other units (its output's name), where scratch adds up.
    assert [u for u in pool_units if ref.graph.scratch[u] != (0, 0, 0)] == [unit]
    assert all(f < pooled_input // 4 for u, (_, f, _) in enumerate(ref.graph.scratch) if u not in pool_units)


def test_a_value_handed_on_or_summed_is_not_scratch():
    """A transpose's output that another equation's transpose reads, or that the
    step returns, is the model's to count; a buffer read only inside is scratch."""
    hlo = """HloModule m

ENTRY %main (p: f32[64]) -> (f32[64], f32[64]) {
  %p = f32[64]{0} parameter(0)
  %a = f32[64]{0} exponential(%p), metadata={op_name="jit(f)/jvp(remat_opt_eqn0)/exp"}
  %t = f32[64]{0} negate(%a), metadata={op_name="jit(f)/transpose(jvp(remat_opt_eqn2))/neg"}
  %s = f32[64]{0} sine(%t), metadata={op_name="jit(f)/transpose(jvp(remat_opt_eqn1))/sin"}
  %u = f32[64]{0} cosine(%s), metadata={op_name="jit(f)/transpose(jvp(remat_opt_eqn1))/cos"}
  %g = f32[64]{0} multiply(%u, %t), metadata={op_name="jit(f)/transpose(jvp(remat_opt_eqn0))/mul"}
  ROOT %out = (f32[64]{0}, f32[64]{0}) tuple(%a, %g)
}
"""
    live_range = """HloLiveRange (max 6):
  InstructionSequence:
    0:p
    1:a
    2:t
    3:s
    4:u
    5:g
    6:out
  BufferLiveRange:
    p{}:0-6
    a{}:1-6
    t{}:2-5
    s{}:3-4
    u{}:4-5
    g{}:5-6
    out{}:6-6
"""
    assignment = "\n".join(f"allocation {k}: size 256, maybe-live-out:\n"
                           f" value: <{k} {n} @0> (size=256,offset=0): f32[64]{{0}}" for k, n in enumerate("ptsug"))
    # s is read only by eqn 1's own cos: scratch, read from a cotangent handed in (t, eqn 2's);
    # u is read by eqn 0's transpose: handed on; t is read by two equations; g is returned.
    assert transpose_scratch(hlo, live_range, assignment) == {1: (256, 0, 0)}


def test_scratch_the_backward_reads_is_held_where_the_pool_runs_as_written():
    """A cut at the pool leaves it to the last segment, which runs as written:
    XLA holds what its backward reads of the forward part from the forward on.
    Counted there (and so in the calibration on the plain program), the model
    comes closer to XLA's peak; where the pool is fenced, nothing changes."""
    args = _args(False)
    ref = reference(BaselineCall(pooled_net, args, budget_bytes=1 << 40))
    graph = ref.graph
    unheld = calibrate(dataclasses.replace(graph, scratch=tuple((b, f, 0) for b, f, _ in graph.scratch)),
                       ref.plain_peak_bytes)
    (pool,) = _eqn_of(pooled_net, args, "reduce_window_max")
    as_written, fenced = Schedule(cuts=frozenset({pool})), Schedule(cuts=frozenset({pool + 1}))
    measured = ref.peak(apply_schedule(ref.fn, graph, as_written))
    error, unheld_error = (abs(simulate(g, as_written).peak_bytes / measured - 1) for g in (graph, unheld))
    assert error < unheld_error - 0.02, (error, unheld_error)
    assert simulate(graph, fenced).peak_bytes == simulate(unheld, fenced).peak_bytes


JAX_0_12 = tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 12)
NCHW_ON_0_12 = pytest.mark.xfail(
    JAX_0_12, strict=True,
    reason="jax 0.12's XLA:CPU measures these three schedules at the same peaks as jax 0.10.2, but its "
           "plain compile shows two NHWC buffers per convolution transpose where 0.10 shows one; held "
           "beside the cotangent, they over-predict (+7.3/+9.4/+17.1% against -0.3/-0.3/+8.3% on 0.10)")


@pytest.mark.parametrize("net, nchw", [pytest.param(nchw_net, True, marks=NCHW_ON_0_12), (pooled_net, False)])
def test_scratch_brings_fenced_schedules_closer_to_xla(net, nchw):
    """Even segmentations of both nets, predicted with and without the scratch
    read off the plain compile, against XLA's peak: closer on the whole, and
    within 10% each (the model without it misses the NHWC cotangents and the
    pool's index buffers)."""
    args = _args(nchw)
    ref = reference(BaselineCall(net, args, budget_bytes=1 << 40))
    without = dataclasses.replace(ref.graph, scratch=())
    n = ref.graph.num_positions
    errors = []
    for k in (2, 3, 4):
        schedule = Schedule(cuts=frozenset(range(n // k, n, n // k)) - {0, n})
        measured = ref.peak(apply_schedule(ref.fn, ref.graph, schedule))
        errors.append(tuple(abs(simulate(g, schedule).peak_bytes / measured - 1) for g in (ref.graph, without)))
    with_, bare = zip(*errors)
    assert sum(with_) < sum(bare) - 0.02 and max(with_) <= 0.10, errors
