"""One compile per distinct program: XLA's figures are kept for the process (memory._compiles)."""

import jax
import jax.numpy as jnp
import pytest

from remat_opt import peak_bytes
from remat_opt.planner._mesh import measurer
from remat_opt.memory import _compiles
from remat_opt.memory._compiled import read_compiled
from remat_opt.memory import gradient_step


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
    monkeypatch.setattr(_compiles, "KEPT", 4)  # two programs: each keeps its peak, and that as figures only
    w = jnp.ones((16, 16))
    for n in (1, 2, 3):
        peak_bytes(loss, w, jnp.ones((n, 16)))
    assert len(compiles) == 3
    peak_bytes(loss, w, jnp.ones((1, 16)))  # dropped, the least recently used
    assert len(compiles) == 4
    peak_bytes(loss, w, jnp.ones((3, 16)))  # kept
    assert len(compiles) == 4


def test_a_compile_for_facts_also_answers_for_the_peak(compiles):
    """The program read for XLA's facts is not compiled again when a candidate lowers to it."""
    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    step, step_args, step_kwargs = gradient_step(loss, (w, x), {}, 0, False)
    facts = read_compiled(step, *step_args, **step_kwargs)
    assert len(compiles) == 1
    measure = measurer((w, x), {}, 0, False, None, figures_only=True)
    assert measure(loss) == facts.peak_bytes and len(compiles) == 1  # the same module, its figure kept
    assert measure(lambda w, x: jnp.sum(jnp.sin(x @ w))) > 0 and len(compiles) == 2  # another, compiled
    # The facts' figure is not the default compile's: remat_opt.peak_bytes compiles as jax.jit does.
    assert peak_bytes(loss, w, x) == facts.peak_bytes and len(compiles) == 3


def test_the_peak_as_jit_compiles_answers_a_later_figures_only_ask(compiles):
    """A user's peak_bytes of the function as written is the only compile of it: optimize's
    figures-only measure of the same module takes the judge's own figure."""
    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    plain = peak_bytes(loss, w, x)
    measure = measurer((w, x), {}, 0, False, None, figures_only=True)
    assert measure(loss) == plain and len(compiles) == 1
    verify = measurer((w, x), {}, 0, False, None)  # as jax.jit compiles: the figure kept by peak_bytes
    assert verify(loss) == plain and len(compiles) == 1
    other = lambda w, x: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    figures_only = measure(other)  # a figures-only figure never answers for the judge's
    assert peak_bytes(other, w, x) == figures_only and len(compiles) == 3
