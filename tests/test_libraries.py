"""Model libraries under ``remat_opt.optimize``, through their usual training steps.

A small GPT decoder written three ways — Flax Linen with ``nn.scan`` over the
blocks (tied head), Flax Linen with a Python loop (untied head), and Equinox
with the blocks stacked by ``eqx.filter_vmap`` and run by ``lax.scan`` over
``eqx.partition``/``eqx.combine`` — is planned at 0.6 of its plain
peak. Each plan is checked against independent answers: XLA's peak of the
user's own compiled step against the budget, and its values and gradients
against the library's plain step (``jax.value_and_grad``,
``eqx.filter_value_and_grad``). The comparison with each library's own checkpoint
of the scanned block, at its peak, is ``experiments/libraries.py``'s, run by
``tests/test_experiments_scan.py::test_libraries_quick``. The Equinox decoder is built here
(``eqx_gpt``, which ``experiments/libraries.py`` imports too) and planned in
``tests/test_libraries_equinox.py``, a file of its own for pytest-xdist to run beside this one.

Equinox modules hold functions, floats and bools as leaves, so the static-leaf
handling (``remat_opt.program._static``) is tested first, without any model library.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat_opt
from remat_opt import peak_bytes
from remat_opt.memory import memory_of
from remat_opt.program._static import StaticLeaf, combine, split
from remat_opt.rewrite import policy_program

FAST = remat_opt.SolverOptions(time_limit_s=60.0, deterministic_time_limit=1.0, num_workers=2)
ATTEMPTS = 2
FRACTIONS = (0.6,)  # of the plain peak; experiments/libraries.py sweeps 0.6, 0.4, 0.25 and each alternative's peak
VOCAB, D_MODEL, HEADS, SEQ, BATCH, LAYERS = 64, 32, 4, 32, 2, 4


def assert_tree_close(got, want, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def tokens() -> tuple[jax.Array, jax.Array]:
    x = jax.random.randint(jax.random.PRNGKey(1), (BATCH, SEQ), 0, VOCAB)
    return x, jnp.roll(x, -1, axis=1)


def cross_entropy(logits: jax.Array, y: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[..., None], axis=-1))


# --- Static leaves ---------------------------------------------------------------------


def act_mlp(p, x):
    for w in p["ws"]:
        x = p["act"](x @ w)
    return jnp.mean(x**2) * p["scale"]


def mlp_inputs(act=jnp.tanh):
    key = jax.random.PRNGKey(0)
    ws = [jax.random.normal(jax.random.fold_in(key, i), (32, 32)) / 6 for i in range(6)]
    return {"ws": ws, "act": act, "scale": 2.0}, jax.random.normal(key, (256, 32))


def test_split_keeps_arrays_and_combine_restores_the_tree():
    namespace = types.SimpleNamespace(a=1)
    tree = ({"w": jnp.ones(3), "act": jnp.tanh, "p": 0.5, "flag": True}, [np.zeros(2), "name", namespace])
    leaves, static = split(tree)
    assert [leaf.shape for leaf in leaves] == [(3,), (2,)]  # tree order: the dict, then the list
    assert static.any and sum(s is None for s in static.leaves) == 2 == static.traced_treedef.num_leaves
    back = combine(leaves, static)
    assert back[0]["act"] is jnp.tanh and back[1][2] is namespace and back[0]["p"] == 0.5
    assert split({"w": jnp.ones(3)})[1].any is False


def test_static_leaf_keys_compare_by_equality_else_identity():
    assert StaticLeaf("gelu") == StaticLeaf("gelu") and hash(StaticLeaf("gelu")) == hash(StaticLeaf("gelu"))
    assert StaticLeaf(jnp.tanh) == StaticLeaf(jnp.tanh) and StaticLeaf(jnp.tanh) != StaticLeaf(jnp.sin)
    assert StaticLeaf(1) != StaticLeaf(True) and StaticLeaf(1) != StaticLeaf(1.0)  # types differ
    a, b = types.SimpleNamespace(k=1), types.SimpleNamespace(k=1)  # unhashable, equal
    assert StaticLeaf(a) == StaticLeaf(a) and StaticLeaf(a) != StaticLeaf(b)

    class ArrayEq:  # hashable, but == gives an array: compared by identity
        __hash__ = object.__hash__

        def __eq__(self, other):
            return np.array([True, True])

    c = ArrayEq()
    assert StaticLeaf(c) == StaticLeaf(c) and StaticLeaf(c) != StaticLeaf(ArrayEq())


def test_callable_and_scalar_leaves_are_closed_over_and_gradients_match():
    p, x = mlp_inputs()
    plain = peak_bytes(act_mlp, p, x)
    budget = int(plain * 0.85)
    step = remat_opt.optimize(act_mlp, budget, solver_options=FAST, max_attempts=ATTEMPTS)
    plan = step.plan(p, x)
    assert plan.measured_peak_bytes <= budget < plan.plain_peak_bytes == plain, str(plan)
    assert plan.num_segments > 1, str(plan)

    # What eqx.filter_value_and_grad does: the arrays are traced, the rest passed as is.
    def value_and_grad(fn, ws):
        return jax.value_and_grad(lambda ws: fn({**p, "ws": ws}, x))(ws)

    assert_tree_close(value_and_grad(step, p["ws"]), value_and_grad(act_mlp, p["ws"]))
    assert step.plan(p, x) is plan  # the call under jax.grad hit the same plan


def test_checkpoint_policy_baselines_close_over_static_leaves():
    # jax.checkpoint rejects a leaf that is not an array (an Equinox module's activation): the
    # policy baselines checkpoint the array leaves only, as eqx.filter_checkpoint does. Their
    # peak and recompute are those of the same program with the static leaves closed over.
    p, x = mlp_inputs()
    arrays = {"ws": p["ws"]}

    def closed(arrays, x):
        return act_mlp({**p, **arrays}, x)

    for policy in ("nothing_saveable", "dots_saveable"):
        got = remat_opt.checkpoint_policy(remat_opt.BaselineCall(act_mlp, (p, x), budget_bytes="1GiB"),
                                          policy)
        want = remat_opt.checkpoint_policy(remat_opt.BaselineCall(closed, (arrays, x), budget_bytes="1GiB"),
                                           policy)
        assert got.measured_peak_bytes == want.measured_peak_bytes
        assert got.measured_recompute_flops == want.measured_recompute_flops
    assert got.measured_recompute_flops > 0  # dots_saveable recomputes the tanh
    program = policy_program(act_mlp, "nothing_saveable")
    assert_tree_close(jax.value_and_grad(lambda ws: program({**p, "ws": ws}, x))(p["ws"]),
                      jax.value_and_grad(lambda ws: act_mlp({**p, "ws": ws}, x))(p["ws"]))


def test_plan_cache_keys_on_static_leaves():
    p, x = mlp_inputs()
    step = remat_opt.optimize(act_mlp, int(peak_bytes(act_mlp, p, x) * 0.85), solver_options=FAST,
                              max_attempts=ATTEMPTS)
    tanh_plan = step.plan(p, x)
    assert step.plan({**p, "act": jnp.tanh}, x) is tanh_plan  # an equal static leaf: cache hit
    sigmoid = {**p, "act": jax.nn.sigmoid}
    assert step.plan(sigmoid, x) is not tanh_plan  # another function: another plan ...
    got = jax.grad(lambda ws: step({**sigmoid, "ws": ws}, x))(p["ws"])
    want = jax.grad(lambda ws: act_mlp({**sigmoid, "ws": ws}, x))(p["ws"])
    assert_tree_close(got, want)  # ... which runs the new function, not the cached one
    assert step.plan({**p, "scale": 3.0}, x) is not tanh_plan  # Python scalars are static too

    def fn(w, ns):
        return jnp.sum(jnp.tanh(w)) * ns.scale

    namespace = types.SimpleNamespace(scale=1.0)  # unhashable: by identity
    roomy = remat_opt.optimize(fn, "1GiB")
    first = roomy.plan(jnp.ones(8), namespace)
    assert roomy.plan(jnp.ones(8), namespace) is first
    assert roomy.plan(jnp.ones(8), types.SimpleNamespace(scale=1.0)) is not first


def test_peak_bytes_differentiates_the_floating_arrays_of_argnums():
    p, x = mlp_inputs()
    p["offset"] = jnp.arange(1024)  # an integer array: an input, not differentiated

    def loss(p, x):
        return act_mlp(p, x) + jnp.sum(p["offset"])

    # The same program with the static leaves closed over and the arrays split by hand.
    def closed(ws, offset, x):
        return loss({**p, "ws": ws, "offset": offset}, x)

    assert peak_bytes(loss, p, x) == peak_bytes(closed, p["ws"], p["offset"], x)
    assert peak_bytes(loss, p, x, argnums=1) == peak_bytes(closed, p["ws"], p["offset"], x, argnums=2)


def test_array_leaf_jax_cannot_trace_raises_naming_the_path():
    p, x = mlp_inputs()
    bad = {**p, "names": np.array(["tanh", "gelu"])}
    with pytest.raises(TypeError, match=r"args\[0\]\['names'\] is an array of dtype <U4"):
        remat_opt.optimize(act_mlp, "1GiB").plan(bad, x)
    with pytest.raises(TypeError, match=r"args\[0\]\['names'\] is an array of dtype <U4"):
        peak_bytes(act_mlp, bad, x)


# --- Flax Linen ------------------------------------------------------------------------


def flax_gpt(scan: bool, checkpoint: Callable[..., bool] | None = None, groups: int = 1):
    """The Flax GPT; with ``scan``, optionally as a user checkpoints it by hand.

    ``checkpoint`` (a ``jax.checkpoint`` policy) puts ``nn.remat`` around the
    scanned block; ``groups > 1`` runs the layers through ``nn.remat_scan`` in
    ``groups`` checkpointed groups (the block parameters then carry a
    ``(groups, LAYERS // groups)`` leading shape: :func:`flax_grouped`).
    """
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
            x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS)(nn.LayerNorm()(x), mask=mask)
            return x + nn.Dense(D_MODEL)(nn.gelu(nn.Dense(4 * D_MODEL)(nn.LayerNorm()(x))))

    class ScanBlock(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            return Block()(x), None

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            embed = nn.Embed(VOCAB, D_MODEL)
            x = embed(tokens) + self.param("pos", nn.initializers.normal(0.02), (SEQ, D_MODEL))
            if scan and groups > 1:
                block = Block if checkpoint is None else nn.remat(Block, policy=checkpoint)
                x = nn.remat_scan(block, lengths=(groups, LAYERS // groups))(name="blocks")(x)
            elif scan:
                body = ScanBlock if checkpoint is None else nn.remat(ScanBlock, policy=checkpoint)
                layers = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True}, length=LAYERS)
                x, _ = layers(name="blocks")(x, None)
            else:
                for _ in range(LAYERS):
                    x = Block()(x)
            x = nn.LayerNorm()(x)
            return embed.attend(x) if scan else nn.Dense(VOCAB, use_bias=False)(x)

    return GPT()


def flax_grouped(params: dict, groups: int) -> dict:
    """The scan GPT's parameters in the layout of ``flax_gpt(scan=True, groups=groups)``."""
    blocks = jax.tree.map(lambda a: a.reshape(groups, -1, *a.shape[1:]), params["blocks"]["Block_0"])
    return {**params, "blocks": blocks}


def flax_ungrouped(params: dict) -> dict:
    """The inverse of :func:`flax_grouped` (for parameters or their gradients)."""
    blocks = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), params["blocks"])
    return {**params, "blocks": {"Block_0": blocks}}


@pytest.fixture(scope="module", params=["scan", "loop"])
def flax_case(request):
    model = flax_gpt(scan=request.param == "scan")
    batch = tokens()
    params = model.init(jax.random.PRNGKey(0), batch[0])["params"]

    def loss(params, batch):
        x, y = batch
        return cross_entropy(model.apply({"params": params}, x), y)

    want = jax.jit(jax.value_and_grad(loss))(params, batch)
    return loss, params, batch, peak_bytes(loss, params, batch), want


@pytest.mark.parametrize("frac", FRACTIONS)
def test_flax_linen_gpt(flax_case, frac):
    loss, params, batch, plain, want = flax_case
    budget = int(plain * frac)
    step = remat_opt.optimize(loss, budget, solver_options=FAST, max_attempts=ATTEMPTS)
    plan = step.plan(params, batch)
    assert plan.plain_peak_bytes == plain
    assert plan.measured_peak_bytes <= budget, str(plan)
    assert plan.status in ("OPTIMAL", "FEASIBLE"), str(plan)
    # The usual step, compiled afresh: its XLA peak is the plan's, and its values are plain JAX's.
    compiled = jax.jit(jax.value_and_grad(step)).lower(params, batch).compile()
    assert memory_of(compiled) == plan.measured_peak_bytes
    assert_tree_close(compiled(params, batch), want)


# --- Equinox ---------------------------------------------------------------------------


def eqx_gpt(checkpoint: Callable[..., bool] | None = None, groups: int = 1):
    """The Equinox GPT; optionally as a user checkpoints it by hand.

    ``checkpoint`` (a ``jax.checkpoint`` policy) puts ``eqx.filter_checkpoint``
    around the scan body; ``groups > 1`` nests the scan in ``groups``
    ``eqx.filter_checkpoint``-ed scans of ``LAYERS // groups`` layers. The
    arrays are the same for every choice (one key).
    """
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(D_MODEL), eqx.nn.LayerNorm(D_MODEL)
            self.attn = eqx.nn.MultiheadAttention(HEADS, D_MODEL, key=k1)
            self.mlp = eqx.nn.MLP(D_MODEL, D_MODEL, 4 * D_MODEL, 1, activation=jax.nn.gelu, key=k2)

        def __call__(self, x):
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h, mask=jnp.tril(jnp.ones((x.shape[0],) * 2, bool)))
            return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

    class GPT(eqx.Module):
        embed: eqx.nn.Embedding
        pos: jax.Array
        blocks: Block  # stacked: every array has a leading layer axis
        ln_f: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self, key):
            ke, kp, kb, kh = jax.random.split(key, 4)
            self.embed = eqx.nn.Embedding(VOCAB, D_MODEL, key=ke)
            self.pos = jax.random.normal(kp, (SEQ, D_MODEL)) * 0.02
            self.blocks = eqx.filter_vmap(Block)(jax.random.split(kb, LAYERS))
            self.ln_f = eqx.nn.LayerNorm(D_MODEL)
            self.head = eqx.nn.Linear(D_MODEL, VOCAB, use_bias=False, key=kh)

        def __call__(self, tokens):
            x = jax.vmap(self.embed)(tokens) + self.pos
            dynamic, static = eqx.partition(self.blocks, eqx.is_array)

            def layer(x, params):
                return eqx.combine(params, static)(x), None

            if checkpoint is not None:
                layer = eqx.filter_checkpoint(layer, policy=checkpoint)
            if groups == 1:
                x, _ = lax.scan(layer, x, dynamic)
            else:
                @eqx.filter_checkpoint
                def group(x, params):
                    return lax.scan(layer, x, params)

                grouped = jax.tree.map(lambda a: a.reshape(groups, -1, *a.shape[1:]), dynamic)
                x, _ = lax.scan(group, x, grouped)
            return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))

    return eqx, GPT(jax.random.PRNGKey(0))


def eqx_loss(model, x, y):
    return cross_entropy(jax.vmap(model)(x), y)
