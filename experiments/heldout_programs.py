"""The held-out programs: where the memory model is measured, never tuned.

The memory model of remat_opt was tuned on the zoo (``remat_opt.zoo``: the
MLP, ResNet, U-Net and GPT at their default and a few other configs). Its
fidelity there says little about programs nobody tuned on. This module fixes,
once, a set of other programs, and ``experiments/heldout.py`` measures the
model on them: predicted against XLA's measured peak, for the baselines'
schedules and for remat_opt's plans at 0.8, 0.6 and 0.4 of the plain peak.

**Rule.** No rule or parameter of the memory model (or of the solver, the
rewriter or the cost model) may be chosen, tuned or checked against these
programs. They are an evaluation set: a change is developed on the zoo (and
``experiments/results/schedule_fidelity.csv``) and only then measured here,
and the result reported whatever it is. If one of these programs ever becomes
the reason for a change, it is no longer held out: move it to a tuning set,
say so in the commit, and add a new held-out program in its place (with a new
name; never change a registered program under its old name).

**Moved** (issue 50): the GRU (``gru``) and the haiku ResNet (``haiku_resnet``) drove
changes to the memory model and the solver (the partials in CP-SAT's encoding, the learned
reach, the scratch rule, ``cache/_lowest.py``), so they are development programs now
(``dev_programs.py``), and two families written before any further change replace them: a
bidirectional tanh RNN unrolled in Python (``birnn``) and a VGG-style dm-haiku net with
GroupNorm (``haiku_vgg``). Results before the move name the old programs.

**How they were chosen** (before any of them was planned or predicted):

* Families and sizes were picked to differ from the zoo's: random residual
  DAGs of dense layers with mixed activations, a conv net with batch-norm and
  stride-2 downsampling, an MLP-Mixer, a pre-LN encoder transformer at width
  160 and depth 5 (the zoo's GPT is a decoder at 128 wide, 8 deep), an
  unrolled GRU, and models written with Flax NNX, Equinox, dm-haiku and
  penzai as their users write them.
* Sizes were set only from two figures: the plain step's XLA peak (aimed at
  roughly 5–60 MiB, activations well above parameters + gradients, so that
  0.4 of it can be within reach) and the time of one compile of
  ``jax.jit(jax.value_and_grad(loss))`` on CPU (a few seconds at most).
  Neither the model's predictions nor any plan were looked at while choosing.
  (One exception, disclosed: while checking that penzai works with jax 0.10.2,
  one plan of a larger penzai prototype — 128 wide, sequence 128, batch 4 —
  was made to time a solve, and its prediction was printed. The registered
  penzai program was sized afterwards from its plain peak only.)
* The random programs are seeds 0..9 of :func:`random_program`, all of them:
  none was dropped or replaced after being seen.
* dm-haiku's ``hk.nets.ResNet18`` itself has 42.6 MiB of parameters, so its
  plain step peaks above 100 MiB at any input (at 64x64, batch 2: 118 MiB)
  and parameters + gradients alone exceed 0.6 of it. The registered program
  is ``hk.nets.ResNet`` with ResNet18's configuration
  (``hk.nets.ResNet.CONFIGS[18]``: blocks, no bottleneck, projections) at
  half its channel widths (the stem's 7x7 convolution too: 32 channels),
  under ``hk.transform_with_state``, at 64x64, batch 6.

Each registry entry is a factory with no arguments that builds the same
program every time (weights from fixed seeds) and returns a
:class:`Program`: the loss, its positional arguments, a description and the
differentiated ``argnums``. Library programs import their library inside the
factory, so the registry imports without them.

**The library's own per-block remat.** Each library factory also takes
``remat_policy``, the name of a ``jax.checkpoint_policies`` policy (default
``None``: the registered program, unchanged). Given one, it builds the same
model, with the same arrays as its arguments, with each block under the
library's own rematerialization as its users write it: ``nnx.remat`` around
each ViT block, ``eqx.filter_checkpoint`` around each Equinox block,
``hk.remat`` around each ResNet block (put there by ``hk.intercept_methods``,
since ``hk.nets.ResNet`` has no remat option of its own) and penzai's
``gradient_checkpointing.Checkpointed`` around each ``TransformerBlock``
(placed with ``pz.select``). These variants are baselines
(``experiments/library_remat.py``), not held-out programs of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MiB = 2**20
# The intended range of each program's plain peak (XLA's, of jit(value_and_grad)).
PEAK_RANGE = (4 * MiB, 64 * MiB)


@dataclass(frozen=True)
class Program:
    """One held-out program: ``jax.value_and_grad(loss, argnums)(*args)`` is its step."""

    loss: Callable[..., Any]
    args: tuple
    description: str
    argnums: int | tuple[int, ...] = 0


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "gelu": jax.nn.gelu,
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
    "silu": jax.nn.silu,
    "softplus": jax.nn.softplus,
}


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


# --- Seeded random programs ----------------------------------------------------------------

RANDOM_SEEDS = tuple(range(10))
_WIDTHS = (96, 128, 192, 256, 320, 384)


def random_program(seed: int) -> Program:
    """A random residual DAG of dense layers, fixed by ``seed`` (numpy's default_rng).

    The batch, input width and depth are drawn first; then each layer is one of

    * ``dense``: ``act(norm(x) @ w + b)`` to a new width;
    * ``residual``: ``x + act(norm(x) @ w1 + b1) @ w2`` (a hidden width drawn);
    * ``gated``: ``act(norm(x) @ w1) * sigmoid(x @ w2)`` to a new width;
    * ``branch``: two paths ``act1(x @ wa)`` and ``act2(norm(x) @ wb)`` joined
      by a sum, a product, or a concatenation followed by a projection;

    where ``norm`` is a layer norm with probability 0.4 and ``act`` one of
    tanh, gelu, relu, sigmoid, silu, softplus. After a layer, with probability
    0.3, a projection of an earlier layer's output is added (a long skip: the
    DAG is not a chain). The loss is a softmax cross-entropy over 16 classes,
    or a mean squared error, drawn. Parameters are argument 0, the batch
    ``(x, target)`` argument 1.
    """
    rng = np.random.default_rng(seed)
    batch = int(rng.choice((384, 512, 640, 768)))
    d_in = int(rng.choice((64, 128, 192)))
    depth = int(rng.integers(6, 13))
    classify = bool(rng.random() < 0.5)

    def act() -> str:
        return str(rng.choice(list(ACTIVATIONS)))

    def width() -> int:
        return int(rng.choice(_WIDTHS))

    params: dict[str, np.ndarray] = {}

    def dense(name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        params[f"{name}_w"] = rng.normal(size=(n_in, n_out)).astype(np.float32) / np.sqrt(n_in)
        if bias:
            params[f"{name}_b"] = (0.1 * rng.normal(size=(n_out,))).astype(np.float32)

    def norm(name: str, n: int) -> str | None:
        if rng.random() >= 0.4:
            return None
        params[f"{name}_scale"] = (1 + 0.1 * rng.normal(size=(n,))).astype(np.float32)
        params[f"{name}_bias"] = (0.1 * rng.normal(size=(n,))).astype(np.float32)
        return name

    layers: list[dict] = []
    widths = [d_in]
    for i in range(depth):
        n = widths[-1]
        kind = str(rng.choice(("dense", "residual", "gated", "branch"), p=(0.3, 0.3, 0.15, 0.25)))
        spec: dict[str, Any] = {"kind": kind, "name": f"l{i}", "norm": norm(f"l{i}_ln", n)}
        if kind == "dense":
            out = width()
            dense(f"l{i}", n, out)
            spec["act"] = act()
        elif kind == "residual":
            out, hidden = n, width()
            dense(f"l{i}_in", n, hidden)
            dense(f"l{i}_out", hidden, n, bias=False)
            spec["act"] = act()
        elif kind == "gated":
            out = width()
            dense(f"l{i}_val", n, out, bias=False)
            dense(f"l{i}_gate", n, out)
            spec["act"] = act()
        else:
            out = width()
            join = str(rng.choice(("sum", "product", "concat")))
            dense(f"l{i}_a", n, out)
            dense(f"l{i}_b", n, out)
            if join == "concat":
                dense(f"l{i}_proj", 2 * out, out, bias=False)
            spec.update(act_a=act(), act_b=act(), join=join)
        if i >= 2 and rng.random() < 0.3:
            source = int(rng.integers(0, i))  # the output of layer source - 1 (0: the input)
            spec["skip"] = source
            if widths[source] != out or rng.random() < 0.5:
                dense(f"l{i}_skip", widths[source], out, bias=False)
        layers.append(spec)
        widths.append(out)
    n_out = 16 if classify else int(rng.choice((32, 64)))
    dense("head", widths[-1], n_out)

    x = rng.normal(size=(batch, d_in)).astype(np.float32)
    target = (rng.integers(0, n_out, size=(batch,)).astype(np.int32) if classify
              else rng.normal(size=(batch, n_out)).astype(np.float32))
    jparams = {k: jnp.asarray(v) for k, v in params.items()}

    def loss(p: dict, data: tuple) -> jax.Array:
        x, target = data
        outputs = [x]
        for spec in layers:
            name = spec["name"]
            h = x if spec["norm"] is None else _layer_norm(x, p[f"{spec['norm']}_scale"], p[f"{spec['norm']}_bias"])
            kind = spec["kind"]
            if kind == "dense":
                y = ACTIVATIONS[spec["act"]](h @ p[f"{name}_w"] + p[f"{name}_b"])
            elif kind == "residual":
                y = x + ACTIVATIONS[spec["act"]](h @ p[f"{name}_in_w"] + p[f"{name}_in_b"]) @ p[f"{name}_out_w"]
            elif kind == "gated":
                y = (ACTIVATIONS[spec["act"]](h @ p[f"{name}_val_w"])
                     * jax.nn.sigmoid(x @ p[f"{name}_gate_w"] + p[f"{name}_gate_b"]))
            else:
                a = ACTIVATIONS[spec["act_a"]](x @ p[f"{name}_a_w"] + p[f"{name}_a_b"])
                b = ACTIVATIONS[spec["act_b"]](h @ p[f"{name}_b_w"] + p[f"{name}_b_b"])
                if spec["join"] == "sum":
                    y = a + b
                elif spec["join"] == "product":
                    y = a * b
                else:
                    y = jnp.concatenate([a, b], axis=-1) @ p[f"{name}_proj_w"]
            if "skip" in spec:
                earlier = outputs[spec["skip"]]
                y = y + (earlier @ p[f"{name}_skip_w"] if f"{name}_skip_w" in p else earlier)
            outputs.append(y)
            x = y
        out = x @ p["head_w"] + p["head_b"]
        if classify:
            return _cross_entropy(out, target)
        return jnp.mean(jnp.square(out - target))

    kinds = ", ".join(f"{s['kind']}{'+skip' if 'skip' in s else ''}" for s in layers)
    description = (f"random residual DAG, seed {seed}: batch {batch}, input {d_in}, {depth} layers "
                   f"({kinds}), widths {widths[1:]}, {'cross-entropy' if classify else 'MSE'} loss")
    return Program(loss, (jparams, (jnp.asarray(x), jnp.asarray(target))), description)


# --- Other families, plain jax.numpy ---------------------------------------------------------


def _normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int = 1) -> jax.Array:
    return jnp.asarray(rng.normal(size=shape).astype(np.float32) / np.sqrt(fan_in))


def _labels(rng: np.random.Generator, shape: tuple[int, ...], classes: int) -> jax.Array:
    return jnp.asarray(rng.integers(0, classes, size=shape).astype(np.int32))


def convnet() -> Program:
    """A conv net: 3x3 convs with batch-norm (batch statistics) and ReLU, residual
    blocks, stride-2 convs between three stages, global average pooling."""
    batch, size, widths, blocks = 12, 32, (24, 48, 96), 2
    rng = np.random.default_rng(101)
    p: dict[str, jax.Array] = {"stem": _normal(rng, (3, 3, 3, widths[0]), 27)}

    def bn(name: str, c: int) -> None:
        p[f"{name}_g"], p[f"{name}_b"] = jnp.ones((c,)), jnp.zeros((c,))

    bn("stem_bn", widths[0])
    for s, c in enumerate(widths):
        if s > 0:
            p[f"down{s}"] = _normal(rng, (3, 3, widths[s - 1], c), 9 * widths[s - 1])
            bn(f"down{s}_bn", c)
        for b in range(blocks):
            for j in (1, 2):
                p[f"s{s}b{b}c{j}"] = _normal(rng, (3, 3, c, c), 9 * c)
                bn(f"s{s}b{b}c{j}_bn", c)
    p["head_w"], p["head_b"] = _normal(rng, (widths[-1], 10), widths[-1]), jnp.zeros((10,))
    x = _normal(rng, (batch, size, size, 3))
    y = _labels(rng, (batch,), 10)

    def conv(x, w, stride=1):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def conv_bn(params, x, name, stride=1):
        """conv, then batch-norm with the batch's statistics (training mode)."""
        x = conv(x, params[name], stride)
        mean = jnp.mean(x, axis=(0, 1, 2))
        var = jnp.var(x, axis=(0, 1, 2))
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * params[f"{name}_bn_g"] + params[f"{name}_bn_b"]

    def loss(params, data):
        x, y = data
        h = jax.nn.relu(conv_bn(params, x, "stem"))
        for s in range(len(widths)):
            if s > 0:
                h = jax.nn.relu(conv_bn(params, h, f"down{s}", 2))
            for b in range(blocks):
                r = jax.nn.relu(conv_bn(params, h, f"s{s}b{b}c1"))
                r = conv_bn(params, r, f"s{s}b{b}c2")
                h = jax.nn.relu(h + r)
        pooled = jnp.mean(h, axis=(1, 2))
        return _cross_entropy(pooled @ params["head_w"] + params["head_b"], y)

    return Program(loss, (p, (x, y)), f"conv net: {batch}x{size}x{size}x3, stages {widths}, "
                   f"{blocks} residual blocks each, batch-norm, stride-2 downsampling")


def mixer() -> Program:
    """An MLP-Mixer: 4x4 patches of 32x32 images, token- and channel-mixing MLPs, pre-LN."""
    batch, size, patch, channels, token_hidden, channel_hidden, depth = 12, 32, 4, 128, 96, 384, 5
    tokens = (size // patch) ** 2
    rng = np.random.default_rng(102)
    p: dict[str, jax.Array] = {"embed_w": _normal(rng, (patch * patch * 3, channels), patch * patch * 3),
                               "embed_b": jnp.zeros((channels,))}
    for i in range(depth):
        for ln in ("ln1", "ln2"):
            p[f"b{i}_{ln}_s"], p[f"b{i}_{ln}_b"] = jnp.ones((channels,)), jnp.zeros((channels,))
        p[f"b{i}_tok1"] = _normal(rng, (tokens, token_hidden), tokens)
        p[f"b{i}_tok2"] = _normal(rng, (token_hidden, tokens), token_hidden)
        p[f"b{i}_ch1"] = _normal(rng, (channels, channel_hidden), channels)
        p[f"b{i}_ch1b"] = jnp.zeros((channel_hidden,))
        p[f"b{i}_ch2"] = _normal(rng, (channel_hidden, channels), channel_hidden)
        p[f"b{i}_ch2b"] = jnp.zeros((channels,))
    p["ln_s"], p["ln_b"] = jnp.ones((channels,)), jnp.zeros((channels,))
    p["head_w"], p["head_b"] = _normal(rng, (channels, 10), channels), jnp.zeros((10,))
    images = _normal(rng, (batch, size, size, 3))
    labels = _labels(rng, (batch,), 10)

    def loss(params, data):
        images, labels = data
        n = size // patch
        x = images.reshape(batch, n, patch, n, patch, 3).transpose(0, 1, 3, 2, 4, 5)
        x = x.reshape(batch, tokens, patch * patch * 3) @ params["embed_w"] + params["embed_b"]
        for i in range(depth):
            h = _layer_norm(x, params[f"b{i}_ln1_s"], params[f"b{i}_ln1_b"])
            h = jnp.swapaxes(h, 1, 2)
            h = jax.nn.gelu(h @ params[f"b{i}_tok1"]) @ params[f"b{i}_tok2"]
            x = x + jnp.swapaxes(h, 1, 2)
            h = _layer_norm(x, params[f"b{i}_ln2_s"], params[f"b{i}_ln2_b"])
            h = jax.nn.gelu(h @ params[f"b{i}_ch1"] + params[f"b{i}_ch1b"])
            x = x + h @ params[f"b{i}_ch2"] + params[f"b{i}_ch2b"]
        x = _layer_norm(x, params["ln_s"], params["ln_b"])
        return _cross_entropy(jnp.mean(x, axis=1) @ params["head_w"] + params["head_b"], labels)

    return Program(loss, (p, (images, labels)), f"MLP-Mixer: {batch}x{size}x{size}x3, {patch}x{patch} patches "
                   f"({tokens} tokens), {channels} channels, token MLP {token_hidden}, channel MLP "
                   f"{channel_hidden}, {depth} blocks")


def encoder() -> Program:
    """A pre-LN encoder transformer (bidirectional attention), token classification loss."""
    batch, seq, d, heads, depth, ratio, vocab = 5, 96, 160, 5, 5, 3, 200
    hd = d // heads
    rng = np.random.default_rng(103)
    p: dict[str, jax.Array] = {"embed": _normal(rng, (vocab, d)), "pos": _normal(rng, (seq, d), 50)}
    for i in range(depth):
        for ln in ("ln1", "ln2"):
            p[f"b{i}_{ln}_s"], p[f"b{i}_{ln}_b"] = jnp.ones((d,)), jnp.zeros((d,))
        p[f"b{i}_qkv"] = _normal(rng, (d, 3 * d), d)
        p[f"b{i}_qkv_b"] = jnp.zeros((3 * d,))
        p[f"b{i}_o"] = _normal(rng, (d, d), d)
        p[f"b{i}_fc"] = _normal(rng, (d, ratio * d), d)
        p[f"b{i}_fc_b"] = jnp.zeros((ratio * d,))
        p[f"b{i}_proj"] = _normal(rng, (ratio * d, d), ratio * d)
    p["ln_s"], p["ln_b"] = jnp.ones((d,)), jnp.zeros((d,))
    p["head"] = _normal(rng, (d, vocab), d)
    tokens = _labels(rng, (batch, seq), vocab)
    targets = _labels(rng, (batch, seq), vocab)

    def loss(params, data):
        tokens, targets = data
        x = params["embed"][tokens] + params["pos"]
        for i in range(depth):
            h = _layer_norm(x, params[f"b{i}_ln1_s"], params[f"b{i}_ln1_b"])
            q, k, v = jnp.split(h @ params[f"b{i}_qkv"] + params[f"b{i}_qkv_b"], 3, axis=-1)
            q, k, v = (t.reshape(batch, seq, heads, hd) for t in (q, k, v))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
            attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(batch, seq, d)
            x = x + attn @ params[f"b{i}_o"]
            h = _layer_norm(x, params[f"b{i}_ln2_s"], params[f"b{i}_ln2_b"])
            x = x + jax.nn.gelu(h @ params[f"b{i}_fc"] + params[f"b{i}_fc_b"]) @ params[f"b{i}_proj"]
        x = _layer_norm(x, params["ln_s"], params["ln_b"])
        return _cross_entropy(x @ params["head"], targets)

    return Program(loss, (p, (tokens, targets)), f"pre-LN encoder transformer: batch {batch}, sequence {seq}, "
                   f"width {d}, {heads} heads, {depth} layers, MLP x{ratio}, vocabulary {vocab}, "
                   "bidirectional attention")


def birnn() -> Program:
    """A bidirectional tanh RNN unrolled in Python: a forward and a backward cell over the
    sequence, their states joined at every step into a readout (MSE). Replaced the GRU
    (moved to the development set, issue 50); written before it was planned or predicted."""
    batch, steps, d_in, hidden, d_out = 160, 14, 48, 224, 24
    rng = np.random.default_rng(111)
    p = {"fx": _normal(rng, (d_in, hidden), d_in), "fh": _normal(rng, (hidden, hidden), hidden),
         "bx": _normal(rng, (d_in, hidden), d_in), "bh": _normal(rng, (hidden, hidden), hidden),
         "fb": jnp.zeros((hidden,)), "bb": jnp.zeros((hidden,)),
         "out_w": _normal(rng, (2 * hidden, d_out), 2 * hidden), "out_b": jnp.zeros((d_out,))}
    xs = _normal(rng, (steps, batch, d_in))
    ys = _normal(rng, (steps, batch, d_out))

    def loss(params, data):
        xs, ys = data
        forward, backward = [], []
        h = jnp.zeros((batch, hidden))
        for t in range(steps):
            h = jnp.tanh(xs[t] @ params["fx"] + h @ params["fh"] + params["fb"])
            forward.append(h)
        h = jnp.zeros((batch, hidden))
        for t in reversed(range(steps)):
            h = jnp.tanh(xs[t] @ params["bx"] + h @ params["bh"] + params["bb"])
            backward.insert(0, h)
        total = 0.0
        for t in range(steps):
            joined = jnp.concatenate([forward[t], backward[t]], axis=-1)
            total = total + jnp.mean(jnp.square(joined @ params["out_w"] + params["out_b"] - ys[t]))
        return total / steps

    return Program(loss, (p, (xs, ys)), f"bidirectional tanh RNN unrolled in Python: {steps} steps, batch {batch}, "
                   f"input {d_in}, hidden {hidden} per direction, readout {d_out} of both states at every step, MSE")


# --- Models from libraries, as their users write them -------------------------------------------


def _policy(remat_policy: str | None) -> Callable[..., bool] | None:
    """The ``jax.checkpoint_policies`` policy named ``remat_policy``; ``None`` for none."""
    if remat_policy is None:
        return None
    policy = getattr(jax.checkpoint_policies, remat_policy, None)
    if policy is None:
        raise ValueError(f"remat_policy must name a jax.checkpoint_policies policy (nothing_saveable, ...); "
                         f"got {remat_policy!r}.")
    return policy


def _remat_note(remat_policy: str | None, how: str) -> str:
    return "" if remat_policy is None else f"; {how} around each block, policy {remat_policy}"


def flax_nnx_vit(remat_policy: str | None = None) -> Program:
    """A small ViT in Flax NNX; the loss merges the parameters into the graph (nnx.split/merge).
    With ``remat_policy``, ``nnx.remat`` with that policy around each block."""
    from flax import nnx

    policy = _policy(remat_policy)

    batch, size, patch, d, heads, depth, classes = 16, 32, 4, 96, 4, 4, 10
    tokens = (size // patch) ** 2

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.ln1 = nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, rngs=rngs)
            self.fc1 = nnx.Linear(d, 2 * d, rngs=rngs)
            self.fc2 = nnx.Linear(2 * d, d, rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))

    class ViT(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.patch = nnx.Conv(3, d, kernel_size=(patch, patch), strides=(patch, patch), rngs=rngs)
            self.cls = nnx.Param(jnp.zeros((1, 1, d)))
            self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, tokens + 1, d)))
            self.blocks = nnx.List([Block(rngs) for _ in range(depth)])
            self.ln = nnx.LayerNorm(d, rngs=rngs)
            self.head = nnx.Linear(d, classes, rngs=rngs)

        def __call__(self, images):
            x = self.patch(images).reshape(images.shape[0], tokens, d)
            cls = jnp.broadcast_to(self.cls[...], (images.shape[0], 1, d))
            x = jnp.concatenate([cls, x], axis=1) + self.pos[...]
            for block in self.blocks:
                if policy is None:
                    x = block(x)
                else:
                    x = nnx.remat(lambda block, x: block(x), policy=policy)(block, x)
            return self.head(self.ln(x)[:, 0])

    model = ViT(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    key = jax.random.PRNGKey(105)
    images = jax.random.normal(key, (batch, size, size, 3))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (batch,), 0, classes)

    def loss(params, images, labels):
        model = nnx.merge(graphdef, params)
        return _cross_entropy(model(images), labels)

    return Program(loss, (params, images, labels), f"Flax NNX ViT: {batch}x{size}x{size}x3, {patch}x{patch} "
                   f"patches + class token ({tokens + 1} tokens), width {d}, {heads} heads, {depth} blocks "
                   "(nnx.MultiHeadAttention, nnx.LayerNorm, nnx.Linear), nnx.split/nnx.merge"
                   + _remat_note(remat_policy, "nnx.remat"))


def equinox_transformer(remat_policy: str | None = None) -> Program:
    """An Equinox encoder, written per example and ``jax.vmap``-ed over the batch; the
    module itself is the differentiated argument (its static leaves as Equinox keeps them).
    With ``remat_policy``, ``eqx.filter_checkpoint`` with that policy around each block
    (the module and its arrays are the same)."""
    import equinox as eqx

    policy = _policy(remat_policy)

    batch, seq, d, heads, depth, vocab = 8, 64, 128, 4, 3, 128

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
            self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
            self.mlp = eqx.nn.MLP(d, d, 3 * d, 1, activation=jax.nn.silu, key=k2)

        def __call__(self, x):
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h)
            return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

    class Encoder(eqx.Module):
        embed: eqx.nn.Embedding
        blocks: list
        ln: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self, key):
            ke, kb, kh = jax.random.split(key, 3)
            self.embed = eqx.nn.Embedding(vocab, d, key=ke)
            self.blocks = [Block(k) for k in jax.random.split(kb, depth)]
            self.ln = eqx.nn.LayerNorm(d)
            self.head = eqx.nn.Linear(d, vocab, key=kh)

        def __call__(self, tokens):
            x = jax.vmap(self.embed)(tokens)
            for block in self.blocks:
                if policy is None:
                    x = block(x)
                else:
                    x = eqx.filter_checkpoint(lambda block, x: block(x), policy=policy)(block, x)
            return jax.vmap(self.head)(jax.vmap(self.ln)(x))

    model = Encoder(jax.random.PRNGKey(106))
    tokens = jax.random.randint(jax.random.PRNGKey(107), (batch, seq), 0, vocab)
    targets = jnp.roll(tokens, 1, axis=1)

    def loss(model, tokens, targets):
        return _cross_entropy(jax.vmap(model)(tokens), targets)

    return Program(loss, (model, tokens, targets), f"Equinox encoder: batch {batch} (jax.vmap of the per-example "
                   f"model), sequence {seq}, width {d}, {heads} heads, {depth} blocks (eqx.nn.MultiheadAttention, "
                   "eqx.nn.MLP with silu, eqx.nn.LayerNorm); the eqx.Module is the differentiated argument"
                   + _remat_note(remat_policy, "eqx.filter_checkpoint"))


def haiku_vgg(remat_policy: str | None = None) -> Program:
    """A VGG-style net written with dm-haiku: three stages of two ``hk.Conv2D`` 3x3 with
    ``hk.GroupNorm`` and ReLU, ``hk.max_pool`` between them, ``hk.Linear`` head, under
    ``hk.transform`` (no state). With ``remat_policy``, ``hk.remat`` with that policy around
    each stage. Replaced the haiku ResNet (moved to the development set, issue 50); written
    before it was planned or predicted."""
    import haiku as hk

    batch, size, widths = 8, 48, (32, 64, 128)
    policy = _policy(remat_policy)

    def stage(x, width):
        for _ in range(2):
            x = hk.Conv2D(width, 3)(x)
            x = jax.nn.relu(hk.GroupNorm(8)(x))
        return x

    def forward(images):
        x = images
        for i, width in enumerate(widths):
            if i:
                x = hk.max_pool(x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")  # = 2, 2 on NHWC, without the int warning
            run = (lambda x, width=width: stage(x, width))
            x = hk.remat(run, policy=policy)(x) if policy is not None else run(x)
        return hk.Linear(10)(jnp.mean(x, axis=(1, 2)))

    model = hk.without_apply_rng(hk.transform(forward))
    key = jax.random.PRNGKey(112)
    images = jax.random.normal(key, (batch, size, size, 3))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (batch,), 0, 10)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), images)

    def loss(params, images, labels):
        return _cross_entropy(model.apply(params, images), labels)

    return Program(loss, (params, images, labels), f"dm-haiku VGG-style net: {batch}x{size}x{size}x3, three stages "
                   f"of two hk.Conv2D 3x3 ({', '.join(map(str, widths))} channels) with hk.GroupNorm(8) and ReLU, "
                   "hk.max_pool between, hk.Linear head, hk.transform" + _remat_note(remat_policy, "hk.remat"))


def penzai_decoder(remat_policy: str | None = None) -> Program:
    """penzai's llama-like decoder (``build_llamalike_transformer``), parameters unbound
    and frozen (``pz.unbind_params``/``pz.freeze_params``), bound again in the loss.
    With ``remat_policy``, each ``TransformerBlock`` wrapped in penzai's
    ``gradient_checkpointing.Checkpointed`` with that policy (the parameters are the same)."""
    from penzai import pz
    from penzai.models.transformer import model_parts
    from penzai.models.transformer.variants import llamalike_common
    from penzai.toolshed import gradient_checkpointing

    policy = _policy(remat_policy)

    batch, seq = 4, 80
    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=3, query_head_multiplier=1, embedding_dim=96, projection_dim=32, mlp_hidden_dim=256,
        num_decoder_blocks=3, vocab_size=320, mlp_variant="swiglu", tie_embedder_and_logits=False,
        parameter_dtype=jnp.float32, activation_dtype=jnp.float32)
    model = llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(109))
    if policy is not None:
        model = (pz.select(model).at_instances_of(model_parts.TransformerBlock)
                 .apply(lambda block: gradient_checkpointing.Checkpointed(block, policy=policy)))
    unbound, params = pz.unbind_params(model)
    frozen = pz.freeze_params(params)
    tokens = jax.random.randint(jax.random.PRNGKey(110), (batch, seq + 1), 0, config.vocab_size)

    def loss(params, tokens):
        model = pz.bind_variables(unbound, params)
        logits = model(pz.nx.wrap(tokens[:, :-1]).tag("batch", "seq"))
        return _cross_entropy(logits.untag("batch", "seq", "vocabulary").unwrap(), tokens[:, 1:])

    return Program(loss, (frozen, tokens), f"penzai llama-like decoder: batch {batch}, sequence {seq}, width 96, "
                   "3 heads of 32, 3 blocks, SwiGLU 256, RMSNorm, RoPE, vocabulary 320, "
                   "pz.unbind_params/freeze_params/bind_variables"
                   + _remat_note(remat_policy, "penzai's Checkpointed"))


PROGRAMS: dict[str, Callable[[], Program]] = {
    **{f"random{seed}": (lambda seed=seed: random_program(seed)) for seed in RANDOM_SEEDS},
    "convnet": convnet,
    "mixer": mixer,
    "encoder": encoder,
    "birnn": birnn,
    "flax_nnx_vit": flax_nnx_vit,
    "equinox_transformer": equinox_transformer,
    "haiku_vgg": haiku_vgg,
    "penzai_decoder": penzai_decoder,
}
# Which library each library program needs (the tests skip a program whose library is missing).
LIBRARIES = {"flax_nnx_vit": "flax.nnx", "equinox_transformer": "equinox", "haiku_vgg": "haiku",
             "penzai_decoder": "penzai"}
