"""One compile per distinct program: XLA's figures are kept for the process (memory._compiles)."""

import jax
import jax.numpy as jnp
import pytest

from remat_opt import peak_bytes
from remat_opt.memory import _compiles


@pytest.fixture
def compiles(monkeypatch):
    """Counts XLA compiles from a clean slate of kept figures."""
    count = []
    compile_ = jax.stages.Lowered.compile

    def counted(self, *args, **kwargs):
        count.append(1)
        return compile_(self, *args, **kwargs)

    _compiles.forget()
    monkeypatch.setattr(jax.stages.Lowered, "compile", counted)
    yield count
    _compiles.forget()


def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def test_the_same_program_is_compiled_once(compiles):
    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    first = peak_bytes(loss, w, x)
    assert len(compiles) == 1
    assert peak_bytes(loss, w, x) == first and len(compiles) == 1
    assert peak_bytes(loss, jnp.zeros((32, 32)), x) == first and len(compiles) == 1  # other values, same program


def test_another_program_or_compiler_compiles_again(compiles, monkeypatch):
    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    small = peak_bytes(loss, w, x)
    assert peak_bytes(loss, w, jnp.ones((64, 32))) > small and len(compiles) == 2  # another shape
    assert peak_bytes(lambda w, x: jnp.sum(jnp.sin(x @ w)), w, x) > 0 and len(compiles) == 3  # another program
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")  # the key names the flags; not read here
    peak_bytes(loss, w, x)
    assert len(compiles) == 4


def test_kept_figures_are_bounded(compiles, monkeypatch):
    monkeypatch.setattr(_compiles, "KEPT", 2)
    w = jnp.ones((16, 16))
    for n in (1, 2, 3):
        peak_bytes(loss, w, jnp.ones((n, 16)))
    assert len(compiles) == 3
    peak_bytes(loss, w, jnp.ones((1, 16)))  # dropped, the least recently used
    assert len(compiles) == 4
    peak_bytes(loss, w, jnp.ones((3, 16)))  # kept
    assert len(compiles) == 4


def test_a_compile_started_ahead_is_waited_for_not_repeated(compiles):
    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    lowered = jax.jit(jax.value_and_grad(loss)).lower(w, x)
    figures = lambda low: low.compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    _compiles.compile_ahead(lowered, "test", figures)
    _compiles.compile_ahead(lowered, "test", figures)  # started already: not again
    assert _compiles.compiled_figures(lowered, "test", figures) == figures(lowered)
    assert len(compiles) == 2  # the one started ahead, and the check's own
    _compiles.compiled_figures(lowered, "test", figures)
    assert len(compiles) == 2


def test_a_compile_started_ahead_that_fails_raises_where_it_is_read(compiles):
    lowered = jax.jit(jax.value_and_grad(loss)).lower(jnp.ones((32, 32)), jnp.ones((8, 32)))

    def failing(low):
        raise RuntimeError("XLA ran out of memory")

    _compiles.compile_ahead(lowered, "failing", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        _compiles.compiled_figures(lowered, "failing", failing)
    assert _compiles.compiled_figures(lowered, "failing", lambda low: 7) == 7  # not kept: read again


def test_a_measurer_gives_the_same_peak_ahead_or_not(compiles):
    from remat_opt._mesh import Measurer

    args = (jnp.ones((32, 32)), jnp.ones((8, 32)))
    measure = Measurer(args, {}, 0, False, None, figures_only=True)
    measure.ahead(loss)
    assert measure(loss) == peak_bytes(loss, *args)
    assert len(compiles) == 2  # figures only ahead, and peak_bytes's default compile
