"""Mixed precision: bfloat16 activations computed from float32 parameters.

Where XLA has no half-precision dot (XLA:CPU under jax 0.10.2), its
float-normalization pass computes a bfloat16 ``dot_general`` in float32, each
operand converted into a buffer of its own, which the forward and the backward
share; where it has one (XLA:CPU under jax 0.12.1) the dot runs in bfloat16.
:func:`remat_opt.program._precision.widened` reads which from the compiler and
the graph is linearized as XLA runs it. These tests hold that reading against
the program at hand, and the model's predicted peak against XLA's
``memory_analysis()`` for the program as written and under fenced schedules,
the way :func:`remat_opt.optimize` uses it (calibrated on the plain program's
peak).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from remat_opt import peak_bytes
from remat_opt.solve import chen_sqrt_n_schedule
from remat_opt.memory import model_graph
from remat_opt.memory import calibrate
from remat_opt.memory import simulate
from remat_opt.rewrite import apply_schedule
from remat_opt._schedule import Schedule
from remat_opt.program._precision import reads_half_precision, widened
from remat_opt.program import trace

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the tolerances were measured on XLA:CPU"
)

# The configuration issue 3 measured (the model predicted 0.61x of XLA's plain peak).
BATCH, WIDTH, LAYERS = 1024, 256, 8
TOLERANCE = 0.05  # issue 3: a bf16-activation model's predicted peak within 5% of XLA's
# Not modelled, and partly cancelling at this shape: a fenced backward keeps a
# float32 copy of the bf16 cotangent its dots read (the model counts less), and
# XLA lays float32 weight copies into gradient buffers not yet written (the
# model counts more). Other shapes of this MLP land within about 10%.


def bf16_mlp(ws, x):
    x = x.astype(jnp.bfloat16)
    for w in ws:
        x = jnp.tanh(x @ w.astype(jnp.bfloat16))
    return jnp.mean(x.astype(jnp.float32) ** 2)


ARGS = (
    [jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32)] * LAYERS,
    jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32),
)


@pytest.fixture(scope="module")
def program():
    graph = model_graph(trace(bf16_mlp, ARGS, {}, (0,)))
    return graph, peak_bytes(bf16_mlp, *ARGS)


def relative_error(predicted: int, measured: int) -> float:
    return abs(predicted - measured) / measured


def test_the_graph_holds_dot_operands_in_the_dtype_xla_computes_them(program):
    # The probe's reading (a tiny dot's gradient) must hold for this program's dots:
    # float32 dots on float32 copies of the bfloat16 activations, one per layer's
    # input at least, where XLA widens them, bfloat16 dots where it does not.
    wide = ("dot_general", "bfloat16") in widened()
    hlo = jax.jit(jax.value_and_grad(bf16_mlp)).lower(*ARGS).compile().as_text()
    dot_types = set(re.findall(r"= (\w+)\[[\d,]*\]\{[\d,]*\} dot\(", hlo))
    assert dot_types == ({"f32"} if wide else {"bf16"})
    entry = hlo[hlo.index("ENTRY"):]
    types = dict(re.findall(r"%([\w.]+) = (\w+\[[\d,]*\])", entry))
    copies = [name for name, operand in re.findall(rf"%([\w.]+) = f32\[{BATCH},{WIDTH}\]\{{1,0\}} fusion\(%([\w.]+)\)", entry)
              if types.get(operand) == f"bf16[{BATCH},{WIDTH}]"]
    assert (len(copies) >= LAYERS - 1) == wide
    graph, _ = program
    dot_operands = {v for u in graph.units if u.primitive == "dot_general" for v in u.inputs}
    activations = {v for v in dot_operands if graph.node_bytes[v] >= BATCH * WIDTH * 2}
    assert activations and {graph.node_dtype[v] for v in activations} == {"float32" if wide else "bfloat16"}
    assert any(graph.residual[v] for v in activations)  # the backward keeps them


def test_bf16_plain_peak(program):
    graph, plain = program
    calibrated = calibrate(graph, plain)
    # Calibration is a fit, not a clamp: the model alone is close (it was 38%
    # under XLA, and the fit clamped at 2x, when it sized bf16 dot operands as bf16).
    assert 0.75 <= calibrated.plain_storage_scale <= 1.25
    assert relative_error(simulate(graph, Schedule(plain=True)).peak_bytes, plain) <= 0.10
    assert relative_error(simulate(calibrated, Schedule(plain=True)).peak_bytes, plain) <= TOLERANCE


@pytest.mark.parametrize("num_segments", [2, 3, 4])
def test_bf16_fenced_schedule_peak(program, num_segments):
    graph, plain = program
    graph = calibrate(graph, plain)
    schedule = chen_sqrt_n_schedule(graph, num_segments)
    assert schedule.cuts
    measured = peak_bytes(apply_schedule(bf16_mlp, graph, schedule), *ARGS)
    assert measured < plain
    assert relative_error(simulate(graph, schedule).peak_bytes, measured) <= TOLERANCE


def test_only_a_program_that_reads_half_precision_asks_the_compiler():
    traced = jax.make_jaxpr(bf16_mlp)(*ARGS)
    assert reads_half_precision(traced.jaxpr)
    assert not reads_half_precision(jax.make_jaxpr(lambda w, x: jnp.tanh(x @ w).sum())(*ARGS[0][:1], ARGS[1]).jaxpr)
    nested = jax.make_jaxpr(jax.jit(lambda w, x: (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).sum()))
    assert reads_half_precision(nested(*ARGS[0][:1], ARGS[1]).jaxpr)  # the dot inside the jit's jaxpr
