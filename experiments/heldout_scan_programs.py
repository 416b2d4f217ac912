"""Held-out scanned decoders: Flax Linen, Flax NNX and Equinox, as their users write them.

Issue 25, item 7: the guarantees the zoo's scanned GPT gets against MaxText's
recipes (``experiments/scan_recipes.py``) must hold for scanned decoders
written with the libraries' own scan idioms. Each factory here builds one
pre-LN causal decoder whose layers run as one loop over stacked parameters,
the way that library's documentation writes it:

* ``flax_linen_scan``: ``nn.scan`` over a ``DecoderLayer`` module
  (``variable_axes={"params": 0}``, ``split_rngs={"params": True}``), as
  MaxText's own Linen decoder does with ``scan_layers``;
* ``flax_nnx_scan``: layers built by ``nnx.split_rngs`` + ``nnx.vmap``
  and run by ``nnx.scan`` (``in_axes=(nnx.Carry, 0)``), as the NNX
  "scan over layers" guide writes it; the loss merges the parameters into the
  graph (``nnx.split``/``nnx.merge``);
* ``equinox_scan``: layers built by ``eqx.filter_vmap`` over keys and run by
  ``lax.scan`` over their arrays (``eqx.partition``/``eqx.combine``), the model
  written per example and ``jax.vmap``-ed over the batch, the module itself
  differentiated.

Every decoder layer tags its projections with ``checkpoint_name`` under
MaxText's names (``query_proj``, ``key_proj``, ``value_proj``, ``context``,
``out_proj``, ``mlpwi``, ``mlpwo``), so MaxText's recipes
(:data:`remat_opt.baselines._maxtext.RECIPES`) apply. With ``recipe``, the
same model (the same arrays) is built with the library's own per-layer remat
under that recipe's ``save_only_these_names`` policy (or, for a name of
``jax.checkpoint_policies``, that built-in policy): ``nn.remat(DecoderLayer,
policy=..., prevent_cse=False)`` inside ``nn.scan`` (as MaxText does),
``nnx.remat(policy=...)`` on the scanned function, ``eqx.filter_checkpoint(layer,
policy=...)`` as the scan body. These variants are baselines, not programs.

**Held out.** As in :mod:`heldout_programs`: nothing of remat_opt may be
chosen, tuned or checked against these programs; they are not in the zoo.
Sizes (width 80, 4 heads of 20, sequence 64, batch 4, vocabulary 160, MLP x4)
were set to differ from the zoo GPT's before any of them was planned, from
the plain peak and compile time alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from heldout_programs import Program, _cross_entropy
from jax.ad_checkpoint import checkpoint_name

from remat_opt.baselines import RECIPES, recipe_policy


@dataclass(frozen=True)
class Sizes:
    """A scanned decoder's sizes."""

    layers: int = 12
    d_model: int = 80
    heads: int = 4
    seq: int = 64
    batch: int = 4
    vocab: int = 160
    mlp_ratio: int = 4


def _causal(scores: jax.Array) -> jax.Array:
    """``scores[..., q, k]`` with the future (``k > q``) masked out."""
    seq = scores.shape[-1]
    return jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, jnp.finfo(scores.dtype).min)


def _tokens(sizes: Sizes, seed: int) -> tuple[jax.Array, jax.Array]:
    key = jax.random.PRNGKey(seed)
    seq = jax.random.randint(key, (sizes.batch, sizes.seq + 1), 0, sizes.vocab)
    return seq[:, :-1], seq[:, 1:]


def _policy(recipe: str | None) -> Callable[..., bool] | None:
    """A MaxText recipe's policy, or a built-in ``jax.checkpoint_policies`` policy by name."""
    if recipe is None:
        return None
    if recipe in RECIPES:
        return recipe_policy(recipe)
    return getattr(jax.checkpoint_policies, recipe)


def _note(recipe: str | None, how: str) -> str:
    if recipe is None:
        return ""
    return f"; {how} per layer, " + (f"MaxText recipe {recipe}" if recipe in RECIPES else f"policy {recipe}")


def flax_linen_scan(sizes: Sizes = Sizes(), recipe: str | None = None) -> Program:
    """A Flax Linen decoder: ``nn.scan`` over ``DecoderLayer`` (``nn.DenseGeneral``
    projections, as MaxText's Linen attention writes them); the loss is
    ``model.apply`` on the parameters. With ``recipe``, ``nn.remat`` of the layer
    with its policy, inside the scan."""
    import flax.linen as nn

    s, policy = sizes, _policy(recipe)
    head_dim = s.d_model // s.heads

    class DecoderLayer(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.LayerNorm(name="pre_attention_norm")(x)
            q = checkpoint_name(nn.DenseGeneral((s.heads, head_dim), name="query")(h), "query_proj")
            k = checkpoint_name(nn.DenseGeneral((s.heads, head_dim), name="key")(h), "key_proj")
            v = checkpoint_name(nn.DenseGeneral((s.heads, head_dim), name="value")(h), "value_proj")
            scores = _causal(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim))
            context = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v), "context")
            out = checkpoint_name(nn.DenseGeneral(s.d_model, axis=(-2, -1), name="out")(context), "out_proj")
            x = x + out
            h = nn.LayerNorm(name="pre_mlp_norm")(x)
            h = nn.gelu(checkpoint_name(nn.Dense(s.mlp_ratio * s.d_model, name="wi")(h), "mlpwi"))
            return x + checkpoint_name(nn.Dense(s.d_model, name="wo")(h), "mlpwo"), None

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            embed = nn.Embed(s.vocab, s.d_model, name="embed")
            x = embed(tokens) + self.param("pos", nn.initializers.normal(0.02), (s.seq, s.d_model))
            layer = DecoderLayer if policy is None else nn.remat(DecoderLayer, policy=policy, prevent_cse=False)
            layers = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=s.layers)
            x, _ = layers(name="layers")(x, None)
            return embed.attend(nn.LayerNorm(name="final_norm")(x))

    model = Decoder()
    tokens, targets = _tokens(s, 111)
    params = model.init(jax.random.PRNGKey(0), tokens)["params"]

    def loss(params, tokens, targets):
        return _cross_entropy(model.apply({"params": params}, tokens), targets)

    return Program(loss, (params, tokens, targets), f"Flax Linen decoder: nn.scan over {s.layers} DecoderLayers "
                   f"(nn.DenseGeneral q/k/v/out, MaxText's checkpoint_names), width {s.d_model}, {s.heads} heads, "
                   f"sequence {s.seq}, batch {s.batch}, vocabulary {s.vocab}, tied head"
                   + _note(recipe, "nn.remat(prevent_cse=False) inside nn.scan"))


def flax_nnx_scan(sizes: Sizes = Sizes(), recipe: str | None = None) -> Program:
    """A Flax NNX decoder: layers created under ``nnx.split_rngs`` + ``nnx.vmap`` and
    run by ``nnx.scan``; the loss merges the parameters (``nnx.merge``). With
    ``recipe``, ``nnx.remat`` with its policy on the scanned function."""
    from flax import nnx

    s, policy = sizes, _policy(recipe)
    head_dim = s.d_model // s.heads

    class DecoderLayer(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            d = s.d_model
            self.attention_norm = nnx.LayerNorm(d, rngs=rngs)
            self.query = nnx.LinearGeneral(d, (s.heads, head_dim), rngs=rngs)
            self.key = nnx.LinearGeneral(d, (s.heads, head_dim), rngs=rngs)
            self.value = nnx.LinearGeneral(d, (s.heads, head_dim), rngs=rngs)
            self.out = nnx.LinearGeneral((s.heads, head_dim), d, axis=(-2, -1), rngs=rngs)
            self.mlp_norm = nnx.LayerNorm(d, rngs=rngs)
            self.wi = nnx.Linear(d, s.mlp_ratio * d, rngs=rngs)
            self.wo = nnx.Linear(s.mlp_ratio * d, d, rngs=rngs)

        def __call__(self, x):
            h = self.attention_norm(x)
            q = checkpoint_name(self.query(h), "query_proj")
            k = checkpoint_name(self.key(h), "key_proj")
            v = checkpoint_name(self.value(h), "value_proj")
            scores = _causal(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim))
            context = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v), "context")
            x = x + checkpoint_name(self.out(context), "out_proj")
            h = nnx.gelu(checkpoint_name(self.wi(self.mlp_norm(x)), "mlpwi"))
            return x + checkpoint_name(self.wo(h), "mlpwo")

    class Decoder(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.embed = nnx.Embed(s.vocab, s.d_model, rngs=rngs)
            self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (s.seq, s.d_model)))

            @nnx.split_rngs(splits=s.layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create_layers(rngs: nnx.Rngs) -> DecoderLayer:
                return DecoderLayer(rngs)

            self.layers = create_layers(rngs)
            self.final_norm = nnx.LayerNorm(s.d_model, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + self.pos[...]

            def layer(x, layer):
                return layer(x)

            if policy is not None:
                layer = nnx.remat(layer, policy=policy, prevent_cse=False)
            x = nnx.scan(layer, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(x, self.layers)
            return self.embed.attend(self.final_norm(x))

    model = Decoder(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens, targets = _tokens(s, 112)

    def loss(params, tokens, targets):
        return _cross_entropy(nnx.merge(graphdef, params)(tokens), targets)

    return Program(loss, (params, tokens, targets), f"Flax NNX decoder: {s.layers} layers from nnx.split_rngs + "
                   "nnx.vmap, run by nnx.scan (nnx.LinearGeneral q/k/v/out, MaxText's checkpoint_names), width "
                   f"{s.d_model}, {s.heads} heads, sequence {s.seq}, batch {s.batch}, vocabulary {s.vocab}, tied "
                   "head, nnx.split/nnx.merge" + _note(recipe, "nnx.remat on the scanned function"))


def equinox_scan(sizes: Sizes = Sizes(), recipe: str | None = None) -> Program:
    """An Equinox decoder written per example: layers stacked by ``eqx.filter_vmap``,
    run by ``lax.scan`` over their arrays, the model ``jax.vmap``-ed over the batch
    and differentiated itself. With ``recipe``, ``eqx.filter_checkpoint`` with its
    policy as the scan body."""
    import equinox as eqx

    s, policy = sizes, _policy(recipe)
    head_dim = s.d_model // s.heads

    class DecoderLayer(eqx.Module):
        attention_norm: eqx.nn.LayerNorm
        query: eqx.nn.Linear
        key: eqx.nn.Linear
        value: eqx.nn.Linear
        out: eqx.nn.Linear
        mlp_norm: eqx.nn.LayerNorm
        wi: eqx.nn.Linear
        wo: eqx.nn.Linear

        def __init__(self, key):
            d, keys = s.d_model, jax.random.split(key, 6)
            self.attention_norm, self.mlp_norm = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
            self.query, self.key, self.value, self.out = (eqx.nn.Linear(d, d, key=k) for k in keys[:4])
            self.wi = eqx.nn.Linear(d, s.mlp_ratio * d, key=keys[4])
            self.wo = eqx.nn.Linear(s.mlp_ratio * d, d, key=keys[5])

        def __call__(self, x):  # x: (seq, d_model), one example
            def heads(linear, h):
                return jax.vmap(linear)(h).reshape(s.seq, s.heads, head_dim)

            h = jax.vmap(self.attention_norm)(x)
            q = checkpoint_name(heads(self.query, h), "query_proj")
            k = checkpoint_name(heads(self.key, h), "key_proj")
            v = checkpoint_name(heads(self.value, h), "value_proj")
            scores = _causal(jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim))
            context = checkpoint_name(jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, -1), v), "context")
            x = x + checkpoint_name(jax.vmap(self.out)(context.reshape(s.seq, s.d_model)), "out_proj")
            h = jax.nn.gelu(checkpoint_name(jax.vmap(self.wi)(jax.vmap(self.mlp_norm)(x)), "mlpwi"))
            return x + checkpoint_name(jax.vmap(self.wo)(h), "mlpwo")

    class Decoder(eqx.Module):
        embed: eqx.nn.Embedding
        pos: jax.Array
        layers: DecoderLayer  # stacked: every array has a leading layer axis
        final_norm: eqx.nn.LayerNorm

        def __init__(self, key):
            ke, kp, kl = jax.random.split(key, 3)
            self.embed = eqx.nn.Embedding(s.vocab, s.d_model, key=ke)
            self.pos = 0.02 * jax.random.normal(kp, (s.seq, s.d_model))
            self.layers = eqx.filter_vmap(DecoderLayer)(jax.random.split(kl, s.layers))
            self.final_norm = eqx.nn.LayerNorm(s.d_model)

        def __call__(self, tokens):
            x = jax.vmap(self.embed)(tokens) + self.pos
            dynamic, static = eqx.partition(self.layers, eqx.is_array)

            def layer(x, params):
                return eqx.combine(params, static)(x), None

            if policy is not None:
                layer = eqx.filter_checkpoint(layer, policy=policy)
            x, _ = jax.lax.scan(layer, x, dynamic)
            return jax.vmap(self.final_norm)(x) @ self.embed.weight.T

    model = Decoder(jax.random.PRNGKey(113))
    tokens, targets = _tokens(s, 114)

    def loss(model, tokens, targets):
        return _cross_entropy(jax.vmap(model)(tokens), targets)

    return Program(loss, (model, tokens, targets), f"Equinox decoder: {s.layers} layers stacked by eqx.filter_vmap, "
                   "run by lax.scan over eqx.partition'ed arrays (eqx.nn.Linear q/k/v/out, MaxText's "
                   f"checkpoint_names), per example under jax.vmap, width {s.d_model}, {s.heads} heads, sequence "
                   f"{s.seq}, batch {s.batch}, vocabulary {s.vocab}, tied head; the eqx.Module is differentiated"
                   + _note(recipe, "eqx.filter_checkpoint as the scan body"))


SCAN_PROGRAMS: dict[str, Callable[..., Program]] = {
    "flax_linen_scan": flax_linen_scan,
    "flax_nnx_scan": flax_nnx_scan,
    "equinox_scan": equinox_scan,
}
"""Name -> factory ``(sizes=Sizes(), recipe=None) -> Program``."""

LIBRARIES = {"flax_linen_scan": "flax.linen", "flax_nnx_scan": "flax.nnx", "equinox_scan": "equinox"}
"""The module each program needs (a test skips the program when it is missing)."""


def gradients(program: Program, loss: Callable[..., Any] | None = None) -> list[jax.Array]:
    """The floating array leaves of the gradient of ``loss`` (default: the program's) at its
    arguments: ``jax.grad``, or Equinox's ``filter_grad`` when a leaf is static."""
    loss = program.loss if loss is None else loss
    if all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(program.args)):
        got = jax.jit(jax.grad(loss, argnums=program.argnums))(*program.args)
    else:
        import equinox as eqx

        got = eqx.filter_jit(eqx.filter_grad(loss))(*program.args)
    return [g for g in jax.tree.leaves(got) if hasattr(g, "dtype")]
