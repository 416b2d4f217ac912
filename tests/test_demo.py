"""The demo a newcomer runs first: a legend, a row per budget with its gradients checked
against jax.grad, and a closing summary that says whether every budget and gradient held."""

import remat_opt
from remat_opt import _demo
from remat_opt.zoo.mlp import MLPConfig

SMALL = MLPConfig(depth=8, width=64, batch=1024)


def test_the_demo_prints_a_legend_rows_with_checked_gradients_and_a_summary(capsys):
    (row,) = _demo.run("mlp", (0.7,), config=SMALL)
    out = capsys.readouterr().out
    assert _demo.LEGEND in out and _demo.HEADER in out
    assert row["measured"] <= row["budget"] and row["grad_error"] <= _demo.GRAD_TOLERANCE and row["ok"]
    last = out.strip().splitlines()[-1]
    assert last.startswith("1 of 1 budgets met on XLA; gradients equal to jax.grad's in 1 of 1 ")


def test_a_wrong_gradient_is_caught_by_the_demo(capsys, monkeypatch):
    """The gradient check is a check: a step whose gradients are twice jax.grad's fails it."""
    monkeypatch.setattr(_demo, "optimize", lambda fn, budget: remat_opt.optimize(lambda p, b: 2 * fn(p, b), budget))
    (row,) = _demo.run("mlp", (1.1,), config=SMALL)  # above the plain peak: fn as written, no solve
    assert 0.9 < row["grad_error"] < 1.1 and not row["ok"]
    assert "gradients equal to jax.grad's in 0 of 1" in capsys.readouterr().out
