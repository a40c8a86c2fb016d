"""A second seeded generator of random Flax NNX models: sequence models, whose operations
reach primitives the chain generator (tests/random_models.py) does not.

``random_sequence_case(seed)`` draws 2-6 layers over a ``(batch, seq, width)`` activation,
each a short pattern from :data:`LAYERS`: a causal multi-head attention (heads split by
reshape and transpose, dropout on its weights), a convolution over the sequence (same or
causal padding, or depthwise), a recurrence by ``lax.scan`` over the sequence (its
parameters closed over), a gated linear unit, a running mean by ``cumsum``, the top-k
tokens gathered by ``take_along_axis``, a sort along the features, a ``roll`` of the
sequence, a ``logsumexp`` pooling, a ``lax.cond`` on a value of the batch, a layer under
``nnx.remat`` (the user's checkpoint), a learned position table, token mixing by
``einsum`` (MLP-Mixer), a straight-through rounding (``stop_gradient``), BatchNorm over
batch and sequence, dropout; with residual adds of earlier activations between them. The
loss is a masked per-token cross-entropy, a mean squared error, or either with a
learnable loss weight read by ``loss_fn`` after the model call.

Values that a ``max``, ``sort`` or ``top_k`` compares are continuous (ties would route
the gradient otherwise in a recomputed block, which is not rounding), and a ``cond``'s
predicate is a mean of continuous values, far from its threshold for the drawn inputs
only by chance: both branches are checked against plain, whichever is taken.

A case is a :class:`random_models.RandomCase` (``loss_fn(model, x, labels, mask,
target)``), so test_random_models.check runs it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from random_models import ACTS, RandomCase, drawn_case, earlier

WIDTH, SEQ, BATCH, HEADS = 8, 6, 2, 2

LAYERS = (
    ("attention",),
    ("conv",),
    ("scan",),
    ("glu",),
    ("cumsum", "linear"),
    ("topk", "linear"),
    ("sort", "linear"),
    ("roll", "act", "linear"),
    ("pool", "linear"),
    ("cond",),
    ("remat",),
    ("positions", "layernorm", "linear"),
    ("mixer",),
    ("round", "linear"),
    ("batchnorm", "act", "linear"),
    ("dropout", "linear"),
    ("rmsnorm", "act", "linear"),
)


class Recurrence(nnx.Module):
    """``h_t = tanh(W x_t + U h_{t-1})`` by ``lax.scan`` over the sequence."""

    def __init__(self, w: int, *, rngs: nnx.Rngs):
        self.w, self.u = nnx.Linear(w, w, rngs=rngs), nnx.Linear(w, w, use_bias=False, rngs=rngs)

    def __call__(self, x):
        def step(h, xt):
            h = jnp.tanh(self.w(xt) + self.u(h))
            return h, h

        _, hs = jax.lax.scan(step, jnp.zeros_like(x[:, 0]), x.swapaxes(0, 1))
        return hs.swapaxes(0, 1)


class Dense(nnx.Module):
    def __init__(self, w: int, act: str, *, rngs: nnx.Rngs):
        self.linear, self.act = nnx.Linear(w, w, rngs=rngs), act

    def __call__(self, x):
        return getattr(jax.nn, self.act)(self.linear(x))


def _layer(kind: str, arg, w: int, rngs: nnx.Rngs):
    if kind == "linear":
        return nnx.Linear(w, w, rngs=rngs)
    if kind == "attention":
        return nnx.Dict(
            qkv=nnx.Linear(w, 3 * w, rngs=rngs),
            out=nnx.Linear(w, w, rngs=rngs),
            drop=nnx.Dropout(arg, rngs=rngs),
        )
    if kind == "conv":
        groups = w if arg == "depthwise" else 1
        padding = "CAUSAL" if arg == "causal" else "SAME"
        return nnx.Conv(w, w, (3,), padding=padding, feature_group_count=groups, rngs=rngs)
    if kind == "scan":
        return Recurrence(w, rngs=rngs)
    if kind == "glu":
        return nnx.Linear(w, 2 * w, rngs=rngs)
    if kind in ("topk", "pool"):
        return nnx.Linear(w, 1, rngs=rngs)
    if kind == "cond":
        return nnx.Dict(a=nnx.Linear(w, w, rngs=rngs), b=nnx.Linear(w, w, rngs=rngs))
    if kind == "remat":
        return Dense(w, arg, rngs=rngs)
    if kind == "positions":
        return nnx.Param(0.1 * jax.random.normal(rngs.params(), (SEQ, w)))
    if kind == "layernorm":
        return nnx.LayerNorm(w, rngs=rngs)
    if kind == "rmsnorm":
        return nnx.RMSNorm(w, rngs=rngs)
    if kind == "batchnorm":
        return nnx.BatchNorm(w, use_running_average=False, rngs=rngs)
    if kind == "mixer":
        return nnx.Param(jnp.eye(SEQ) + 0.1 * jax.random.normal(rngs.params(), (SEQ, SEQ)))
    if kind == "dropout":
        return nnx.Dropout(arg, rngs=rngs)
    return None


class SequenceModel(nnx.Module):
    def __init__(self, ops: tuple, *, rngs: nnx.Rngs):
        self.ops = list(ops)  # held as a (list) attribute, as configs are
        self.embed = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.layers = nnx.List([_layer(kind, arg, WIDTH, rngs) for kind, arg in ops])
        self.head = nnx.Linear(WIDTH, 3, rngs=rngs)
        self.loss_weight = nnx.Param(jnp.array(0.5))

    def __call__(self, x, mask):
        x = self.embed(x)
        seen = [x]
        for (kind, arg), layer in zip(self.ops, self.layers, strict=True):
            x = _apply(kind, arg, layer, x, mask, seen)
            seen.append(x)
        return self.head(x)


def _attention(p, x):
    b, s, w = x.shape
    q, k, v = (
        t.reshape(b, s, HEADS, w // HEADS).transpose(0, 2, 1, 3)
        for t in jnp.split(p["qkv"](x), 3, -1)
    )
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(w // HEADS)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    heads = p["drop"](jax.nn.softmax(scores, -1)) @ v
    return x + p["out"](heads.transpose(0, 2, 1, 3).reshape(b, s, w))


def _apply(kind, arg, layer, x, mask, seen):
    if kind in ("linear", "layernorm", "rmsnorm", "batchnorm", "dropout", "conv", "scan"):
        return layer(x)
    if kind == "act":
        return getattr(jax.nn, arg)(x)
    if kind == "residual":
        return x + earlier(seen, x, arg)
    if kind == "attention":
        return _attention(layer, x)
    if kind == "glu":
        return jax.nn.glu(layer(x), axis=-1)
    if kind == "cumsum":
        return jnp.cumsum(x * mask[..., None], axis=1) / jnp.arange(1, x.shape[1] + 1)[:, None]
    if kind == "topk":  # the k best-scored tokens' mean, added to every token
        _, top = jax.lax.top_k(layer(x)[..., 0], 2)
        return x + jnp.take_along_axis(x, top[..., None], axis=1).mean(1, keepdims=True)
    if kind == "sort":
        return jnp.sort(x, axis=-1)
    if kind == "roll":
        return x + jnp.roll(x, 1, axis=1)
    if kind == "pool":  # attention pooling by logsumexp of scores
        scores = layer(x)
        return x - jax.nn.logsumexp(scores, axis=1, keepdims=True)
    if kind == "cond":
        return jax.lax.cond(
            jnp.mean(x) > 0, lambda x: layer["a"](x), lambda x: jnp.tanh(layer["b"](x)), x
        )
    if kind == "remat":
        return nnx.remat(lambda m, x: m(x))(layer, x)
    if kind == "positions":
        return x + layer[...]
    if kind == "mixer":
        return jnp.einsum("bsw,st->btw", x, layer[...])
    if kind == "round":  # straight-through estimator
        return x + jax.lax.stop_gradient(jnp.round(x * 4) / 4 - x)
    raise ValueError(kind)


def draw_ops(rng: np.random.Generator) -> tuple:
    """2-6 layers of :data:`LAYERS` with their arguments (activations, dropout rates,
    convolution kinds), with residual adds between them."""
    ops: list = []
    for _ in range(int(rng.integers(2, 7))):
        for kind in LAYERS[int(rng.integers(len(LAYERS)))]:
            arg = None
            if kind in ("act", "remat"):
                arg = ACTS[int(rng.integers(len(ACTS)))]
            elif kind in ("dropout", "attention"):
                arg = float(rng.choice([0.0, 0.1, 0.5]))
            elif kind == "conv":
                arg = ("same", "causal", "depthwise")[int(rng.integers(3))]
            ops.append((kind, arg))
        if rng.random() < 0.4:
            ops.append(("residual", int(rng.integers(4))))
    return tuple(ops)


def random_sequence_case(seed: int) -> RandomCase:
    rng = np.random.default_rng(seed)
    ops = draw_ops(rng)
    loss_kind = ("xent", "mse", "weighted")[int(rng.integers(3))]
    x = jnp.asarray(rng.standard_normal((BATCH, SEQ, WIDTH)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 3, (BATCH, SEQ)), jnp.int32)
    mask = jnp.asarray(np.arange(SEQ)[None] < rng.integers(2, SEQ + 1, (BATCH, 1)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((BATCH, SEQ, 3)), jnp.float32)

    def loss_fn(model, x, labels, mask, target):
        out = model(x, mask)
        if loss_kind == "mse":
            return jnp.mean((out - target) ** 2)
        logp = jax.nn.log_softmax(out)
        nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
        xent = jnp.sum(nll * mask) / jnp.sum(mask)
        if loss_kind == "xent":
            return xent
        return xent * model.loss_weight[...] + jnp.mean(out**2)

    def factory():
        return SequenceModel(ops, rngs=nnx.Rngs(seed, dropout=seed + 1))

    return drawn_case(seed, ops, factory, loss_fn, (x, labels, mask, target), rng)
