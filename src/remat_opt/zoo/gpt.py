"""GPT-style decoder-only transformer trained with next-token cross-entropy.

Token embedding plus learned positions, ``num_layers`` pre-LN blocks
(``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``) with multi-head causal
self-attention (``jax.nn.softmax``) and a GELU MLP, a final layer norm and a tied
(``logits = h @ wte.T``) or untied (``params["unembed"]``) output projection.
Only the blocks are wrapped layers; embedding and head are not.

The number of heads is read from the shape of ``w_q`` (``(d_model, heads,
head_dim)``), so :func:`loss` needs no config. Each block materialises
``batch * heads * seq_len**2`` attention scores; at ``seq_len >= 512`` with the
default widths they dominate a block's activation memory (see
:func:`attention_score_bytes`).
"""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from ._spec import ModelSpec, normal, numpy_rng, to_jax

__all__ = [
    "GPTConfig", "init", "block", "loss", "stack_layers", "scan_loss", "num_layers", "attention_score_bytes", "SPEC",
]

Params = dict[str, Any]
Batch = dict[str, jax.Array]
LayerFn = Callable[..., jax.Array]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the GPT decoder.

    Attributes:
        num_layers: Number of transformer blocks (each one is a wrapped layer).
        d_model: Residual-stream width; must be divisible by ``num_heads``.
        num_heads: Attention heads per block.
        seq_len: Tokens per sequence (the attention scores grow as its square).
        batch: Sequences in the generated batch.
        vocab: Vocabulary size of the integer tokens.
        mlp_ratio: Hidden width of the MLP as a multiple of ``d_model``.
        tie_embeddings: Whether the unembedding reuses the token embedding.
    """

    num_layers: int = 8
    d_model: int = 128
    num_heads: int = 4
    seq_len: int = 128
    batch: int = 4
    vocab: int = 256
    mlp_ratio: int = 4
    tie_embeddings: bool = True


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def _block_init(rng: np.random.Generator, config: GPTConfig) -> Params:
    d, h = config.d_model, config.num_heads
    dh, hidden = d // h, config.mlp_ratio * d
    std = 0.02
    out_std = std / math.sqrt(2 * config.num_layers)
    f32 = np.float32
    return {
        "ln1_scale": np.ones((d,), f32),
        "ln1_bias": np.zeros((d,), f32),
        "w_q": normal(rng, (d, h, dh), std),
        "w_k": normal(rng, (d, h, dh), std),
        "w_v": normal(rng, (d, h, dh), std),
        "b_q": np.zeros((h, dh), f32),
        "b_k": np.zeros((h, dh), f32),
        "b_v": np.zeros((h, dh), f32),
        "w_o": normal(rng, (h, dh, d), out_std),
        "b_o": np.zeros((d,), f32),
        "ln2_scale": np.ones((d,), f32),
        "ln2_bias": np.zeros((d,), f32),
        "w_fc": normal(rng, (d, hidden), std),
        "b_fc": np.zeros((hidden,), f32),
        "w_proj": normal(rng, (hidden, d), out_std),
        "b_proj": np.zeros((d,), f32),
    }


def init(config: GPTConfig, key: jax.Array) -> tuple[Params, Batch]:
    """Creates parameters and a batch of random token sequences.

    Args:
        config: Model sizes.
        key: PRNG key; the same key always gives the same arrays.

    Returns:
        ``(params, batch)``: ``params`` has ``wte`` ``(vocab, d_model)``, ``wpe``
        ``(seq_len, d_model)``, ``layers`` (one dict per block), ``ln_f_scale``,
        ``ln_f_bias`` and, if untied, ``unembed`` ``(d_model, vocab)``; ``batch`` has
        int32 ``tokens`` and ``targets`` of shape ``(batch, seq_len)``, where
        ``targets[:, t] == tokens[:, t + 1]`` for ``t < seq_len - 1``.
    """
    if config.d_model % config.num_heads:
        raise ValueError(f"d_model must be divisible by num_heads, got {config}")
    rng = numpy_rng(key)
    d = config.d_model
    params: Params = {
        "wte": normal(rng, (config.vocab, d), 0.02),
        "wpe": normal(rng, (config.seq_len, d), 0.01),
        "layers": [_block_init(rng, config) for _ in range(config.num_layers)],
        "ln_f_scale": np.ones((d,), np.float32),
        "ln_f_bias": np.zeros((d,), np.float32),
    }
    if not config.tie_embeddings:
        params["unembed"] = normal(rng, (d, config.vocab), 0.02)
    seq = rng.integers(0, config.vocab, (config.batch, config.seq_len + 1), dtype=np.int32)
    return to_jax((params, {"tokens": seq[:, :-1], "targets": seq[:, 1:]}))


def block(layer_params: Params, x: jax.Array, *, names: bool = False) -> jax.Array:
    """One pre-LN transformer block with causal multi-head self-attention.

    Args:
        layer_params: One entry of ``params["layers"]``.
        x: Residual stream of shape ``(batch, seq, d_model)``.
        names: Tag the projections with MaxText's names (``checkpoint_name``)
            (``query_proj``, ``key_proj``, ``value_proj``, ``context``, ``out_proj``,
            ``mlpwi``, ``mlpwo``), as MaxText's decoder layers do, so that its
            remat recipes (:mod:`remat_opt.baselines._maxtext`) apply. Same values.

    Returns:
        The updated residual stream, same shape as ``x``.
    """
    p = layer_params
    seq = x.shape[1]
    head_dim = p["w_q"].shape[-1]
    tag = checkpoint_name if names else (lambda value, _: value)
    h = _layer_norm(x, p["ln1_scale"], p["ln1_bias"])
    q = tag(jnp.einsum("bsd,dhe->bhse", h, p["w_q"]) + p["b_q"][:, None, :], "query_proj")
    k = tag(jnp.einsum("bsd,dhe->bhse", h, p["w_k"]) + p["b_k"][:, None, :], "key_proj")
    v = tag(jnp.einsum("bsd,dhe->bhse", h, p["w_v"]) + p["b_v"][:, None, :], "value_proj")
    scores = jnp.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    attn = tag(jnp.einsum("bhqk,bhke->bqhe", probs, v), "context")
    x = x + tag(jnp.einsum("bqhe,hed->bqd", attn, p["w_o"]), "out_proj") + p["b_o"]
    h = _layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    h = jax.nn.gelu(tag(h @ p["w_fc"] + p["b_fc"], "mlpwi"))
    return x + tag(h @ p["w_proj"], "mlpwo") + p["b_proj"]


def _embed(params: Params, tokens: jax.Array) -> jax.Array:
    return jnp.take(params["wte"], tokens, axis=0) + params["wpe"][: tokens.shape[1]]


def _head(params: Params, h: jax.Array, batch: Batch) -> jax.Array:
    h = _layer_norm(h, params["ln_f_scale"], params["ln_f_bias"])
    unembed = params["unembed"] if "unembed" in params else params["wte"].T
    logp = jax.nn.log_softmax(h @ unembed, axis=-1)
    picked = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)
    return -jnp.mean(picked)


def loss(
    params: Params,
    batch: Batch,
    *,
    layer_wrapper: Callable[[LayerFn], LayerFn] | None = None,
) -> jax.Array:
    """Mean next-token cross-entropy of the decoder on ``batch["targets"]``.

    Args:
        params: As returned by :func:`init`.
        batch: As returned by :func:`init`; ``tokens`` may be shorter than the
            ``wpe`` table, not longer.
        layer_wrapper: Applied to :func:`block` once per block before calling it;
            ``None`` means no wrapping.

    Returns:
        Scalar float32 loss.
    """
    wrap = layer_wrapper if layer_wrapper is not None else (lambda f: f)
    h = _embed(params, batch["tokens"])
    for layer_params in params["layers"]:
        h = wrap(block)(layer_params, h)
    return _head(params, h, batch)


def stack_layers(params: Params) -> Params:
    """``params`` with ``layers`` stacked into one dict of ``(num_layers, ...)`` arrays,
    the layout :func:`scan_loss` runs ``lax.scan`` over."""
    stacked = dict(params)
    stacked["layers"] = jax.tree.map(lambda *leaves: jnp.stack(leaves), *params["layers"])
    return stacked


def scan_loss(
    params: Params,
    batch: Batch,
    *,
    body_policy: Callable[..., bool] | None = None,
    groups: int = 1,
    names: bool = True,
) -> jax.Array:
    """:func:`loss` with the blocks run by ``lax.scan`` over stacked layer params.

    The usual way large JAX models are written, and the two ways their users
    checkpoint them by hand: a policy on the scan body, and the scan split
    into ``groups`` nested scans, each group checkpointed whole (sqrt(L)
    checkpointing over layers).

    Args:
        params: As returned by :func:`stack_layers`.
        batch: As returned by :func:`init`.
        body_policy: If given, the body runs under ``jax.checkpoint`` with it.
        groups: Must divide the number of layers; ``1`` means one flat scan.
        names: The blocks tag their projections with MaxText's names
            (:func:`block`), so a ``save_only_these_names`` policy can name them.

    Returns:
        Scalar float32 loss, equal to :func:`loss` on the unstacked params.
    """
    h = _embed(params, batch["tokens"])

    def body(x: jax.Array, layer_params: Params) -> tuple[jax.Array, None]:
        return block(layer_params, x, names=names), None

    if body_policy is not None:
        body = jax.checkpoint(body, policy=body_policy)
    layers = params["layers"]
    count = jax.tree.leaves(layers)[0].shape[0]
    if groups == 1:
        h, _ = lax.scan(body, h, layers)
    else:
        if count % groups:
            raise ValueError(f"groups={groups} must divide the {count} layers.")
        grouped = jax.tree.map(lambda a: a.reshape(groups, count // groups, *a.shape[1:]), layers)

        @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
        def group(x: jax.Array, group_params: Params) -> tuple[jax.Array, None]:
            return lax.scan(body, x, group_params)[0], None

        h, _ = lax.scan(group, h, grouped)
    return _head(params, h, batch)


def num_layers(config: GPTConfig) -> int:
    """Number of wrapped layers (transformer blocks) of a model.

    Args:
        config: Model sizes.

    Returns:
        ``config.num_layers``.
    """
    return config.num_layers


def attention_score_bytes(config: GPTConfig) -> int:
    """Bytes of one block's float32 attention-score tensor.

    Args:
        config: Model sizes.

    Returns:
        ``batch * num_heads * seq_len**2 * 4``.
    """
    return config.batch * config.num_heads * config.seq_len**2 * 4


SPEC = ModelSpec(
    name="gpt",
    config_type=GPTConfig,
    default_config=GPTConfig(),
    init=init,
    loss=loss,
    num_layers=num_layers,
)
