"""More feature models (test_feature_models.py runs them with its helpers): layers of
architectures published since the zoo was written, and operations no other model used,
written at stop 55 as a new user would:

- ``gat``: a graph attention network, edge softmax by ``jax.ops.segment_max`` and
  ``segment_sum`` over integer edge lists given as arguments, dropout;
- ``ragged_moe``: a mixture of experts whose tokens are sorted by expert
  (``argsort``, ``bincount``) and run by ``jax.lax.ragged_dot`` (grouped matmuls), a
  scatter back, a load-balancing term returned with the logits;
- ``dit``: a diffusion transformer, adaLN-Zero modulation (zero-initialized
  ``Linear``: the blocks' other gradients are zero at initialization), sinusoidal
  timestep embeddings, classifier-free label dropout from a mask argument, a patch
  ``Conv`` and an unpatchify by ``reshape`` / ``transpose``, a noising step in the loss;
- ``conformer``: macaron feed-forward halves in ``nnx.Sequential``, multi-head
  attention with dropout and a padding mask (``make_attention_mask``), a depthwise
  convolution (``feature_group_count``) with ``glu`` and BatchNorm in training mode, a
  strided subsampling convolution, a masked per-frame loss;
- ``switch``: ``lax.switch`` on an integer argument over three branches, one of them a
  layer;
- ``circular``: ``CIRCULAR`` padded convolutions, ``max_pool`` and a ``SAME`` padded
  ``avg_pool``, BatchNorm;
- ``qat``: quantization-aware training by ``lax.reduce_precision`` with a
  straight-through estimator on the weights, and on the activations;
- ``masked_attn``: ``jax.nn.dot_product_attention`` with a learnable bias and a mask
  under which one sequence has no valid token (its rows masked out after).

Each equalled plain ``nnx.value_and_grad`` when written (tests/jax_exec/
test_feature_models.py's check: ``value_and_grad`` eagerly, under ``nnx.jit`` and with
``has_aux``, ``plan`` at the least budget and at 65% on both paths), with no warning.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from feature_models import _case, _key, _metrics, classify
from flax import nnx
from zoo import Case


class GATLayer(nnx.Module):
    def __init__(self, din, dout, heads, *, rngs):
        self.w = nnx.Linear(din, dout * heads, use_bias=False, rngs=rngs)
        self.a_src = nnx.Param(jax.random.normal(rngs.params(), (heads, dout)) * 0.1)
        self.a_dst = nnx.Param(jax.random.normal(rngs.params(), (heads, dout)) * 0.1)
        self.heads, self.dout = heads, dout

    def __call__(self, x, src, dst):
        n = x.shape[0]
        h = self.w(x).reshape(n, self.heads, self.dout)
        e = jax.nn.leaky_relu(
            (h[src] * self.a_src[...]).sum(-1) + (h[dst] * self.a_dst[...]).sum(-1), 0.2
        )
        m = jax.ops.segment_max(e, dst, num_segments=n)
        p = jnp.exp(e - m[dst])
        z = jax.ops.segment_sum(p, dst, num_segments=n)
        alpha = p / (z[dst] + 1e-9)
        out = jax.ops.segment_sum(alpha[..., None] * h[src], dst, num_segments=n)
        return out.reshape(n, -1)


class GAT(nnx.Module):
    def __init__(self, *, rngs):
        self.l1 = GATLayer(8, 8, 2, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.l2 = GATLayer(16, 4, 1, rngs=rngs)

    def __call__(self, x, src, dst):
        return self.l2(self.drop(jax.nn.elu(self.l1(x, src, dst))), src, dst)


def gat():
    n, e = 10, 30
    src = jax.random.randint(_key(1), (e,), 0, n)
    dst = jnp.concatenate([jnp.arange(n), jax.random.randint(_key(2), (e - n,), 0, n)])
    x = jax.random.normal(_key(3), (n, 8))
    y = jax.random.randint(_key(4), (n,), 0, 4)

    def loss(m, x, s, d, y):
        return optax.softmax_cross_entropy_with_integer_labels(m(x, s, d), y).mean()

    return _case(
        "gat", lambda: GAT(rngs=nnx.Rngs(0)), _metrics(loss), (x, src, dst, y), "segment_max/sum"
    )


class RaggedMoE(nnx.Module):
    def __init__(self, d=16, experts=4, hidden=32, *, rngs):
        self.router = nnx.Linear(d, experts, rngs=rngs)
        self.w1 = nnx.Param(jax.random.normal(rngs.params(), (experts, d, hidden)) / 4)
        self.w2 = nnx.Param(jax.random.normal(rngs.params(), (experts, hidden, d)) / 6)
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, 3, rngs=rngs)
        self.experts = experts

    def __call__(self, x):
        h = self.norm(x)
        logits = self.router(h)
        probs = jax.nn.softmax(logits, -1)
        expert = jnp.argmax(logits, -1)
        order = jnp.argsort(expert)
        sizes = jnp.bincount(expert, length=self.experts).astype(jnp.int32)
        xs = h[order]
        y = jax.lax.ragged_dot(
            jax.nn.gelu(jax.lax.ragged_dot(xs, self.w1[...], sizes)), self.w2[...], sizes
        )
        y = jnp.zeros_like(y).at[order].set(y)
        gate = jnp.take_along_axis(probs, expert[:, None], -1)
        frac = sizes / x.shape[0]
        balance = self.experts * jnp.sum(frac * probs.mean(0))
        return self.head(x + gate * y), balance


def ragged_moe():
    x = jax.random.normal(_key(1), (24, 16))
    y = jax.random.randint(_key(2), (24,), 0, 3)

    def loss(m, x, y):
        logits, balance = m(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean() + 0.01 * balance

    return _case(
        "ragged_moe", lambda: RaggedMoE(rngs=nnx.Rngs(0)), _metrics(loss), (x, y), "ragged_dot"
    )


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half) / half)
    args = t[:, None].astype(jnp.float32) * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)


class DiTBlock(nnx.Module):
    def __init__(self, d, heads, *, rngs):
        self.n1 = nnx.LayerNorm(d, use_scale=False, use_bias=False, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, d, decode=False, rngs=rngs)
        self.n2 = nnx.LayerNorm(d, use_scale=False, use_bias=False, rngs=rngs)
        self.mlp1 = nnx.Linear(d, 4 * d, rngs=rngs)
        self.mlp2 = nnx.Linear(4 * d, d, rngs=rngs)
        self.ada = nnx.Linear(d, 6 * d, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, x, c):
        s1, b1, g1, s2, b2, g2 = jnp.split(self.ada(jax.nn.silu(c))[:, None], 6, -1)
        h = self.n1(x) * (1 + s1) + b1
        x = x + g1 * self.attn(h)
        h = self.n2(x) * (1 + s2) + b2
        return x + g2 * self.mlp2(jax.nn.gelu(self.mlp1(h), approximate=True))


class DiT(nnx.Module):
    def __init__(self, *, rngs, patch=2, c=3, d=32, classes=5):
        self.patch, self.c, self.classes = patch, c, classes
        self.embed = nnx.Conv(c, d, (patch, patch), strides=patch, rngs=rngs)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (1, 16, d)) * 0.02)
        self.t1 = nnx.Linear(16, d, rngs=rngs)
        self.t2 = nnx.Linear(d, d, rngs=rngs)
        self.labels = nnx.Embed(classes + 1, d, rngs=rngs)
        self.blocks = nnx.List([DiTBlock(d, 4, rngs=rngs) for _ in range(2)])
        self.final_ada = nnx.Linear(d, 2 * d, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.final_norm = nnx.LayerNorm(d, use_scale=False, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(d, patch * patch * c, rngs=rngs)

    def __call__(self, x, t, y, drop):
        b, hh, ww, c = x.shape
        y = jnp.where(drop, self.classes, y)  # classifier-free guidance dropout (given mask)
        h = self.embed(x).reshape(b, -1, self.pos.shape[-1]) + self.pos[...]
        cond = self.t2(jax.nn.silu(self.t1(timestep_embedding(t, 16)))) + self.labels(y)
        for blk in self.blocks:
            h = blk(h, cond)
        shift, scale = jnp.split(self.final_ada(jax.nn.silu(cond))[:, None], 2, -1)
        h = self.out(self.final_norm(h) * (1 + scale) + shift)
        p = self.patch
        h = h.reshape(b, hh // p, ww // p, p, p, c).transpose(0, 1, 3, 2, 4, 5)
        return h.reshape(b, hh, ww, c)


def dit():
    x0 = jax.random.normal(_key(1), (4, 8, 8, 3))
    noise = jax.random.normal(_key(2), x0.shape)
    t = jax.random.randint(_key(3), (4,), 0, 1000)
    y = jax.random.randint(_key(4), (4,), 0, 5)
    drop = jax.random.bernoulli(_key(5), 0.25, (4,))

    def loss(m, x0, noise, t, y, drop):
        abar = jnp.cos(t / 1000 * jnp.pi / 2)[:, None, None, None] ** 2
        xt = jnp.sqrt(abar) * x0 + jnp.sqrt(1 - abar) * noise
        return jnp.mean((m(xt, t, y, drop) - noise) ** 2)

    return _case(
        "dit", lambda: DiT(rngs=nnx.Rngs(0)), _metrics(loss), (x0, noise, t, y, drop), "adaLN-Zero"
    )


class ConformerBlock(nnx.Module):
    def __init__(self, d, *, rngs):
        self.ff1 = nnx.Sequential(
            nnx.LayerNorm(d, rngs=rngs),
            nnx.Linear(d, 4 * d, rngs=rngs),
            nnx.swish,
            nnx.Dropout(0.1, rngs=rngs),
            nnx.Linear(4 * d, d, rngs=rngs),
        )
        self.ln_att = nnx.LayerNorm(d, rngs=rngs)
        self.att = nnx.MultiHeadAttention(
            4, d, dropout_rate=0.1, decode=False, deterministic=False, rngs=rngs
        )
        self.ln_conv = nnx.LayerNorm(d, rngs=rngs)
        self.pw1 = nnx.Conv(d, 2 * d, (1,), rngs=rngs)
        self.dw = nnx.Conv(d, d, (5,), feature_group_count=d, padding="SAME", rngs=rngs)
        self.bn = nnx.BatchNorm(d, rngs=rngs)
        self.pw2 = nnx.Conv(d, d, (1,), rngs=rngs)
        self.ff2 = nnx.Sequential(
            nnx.LayerNorm(d, rngs=rngs),
            nnx.Linear(d, 4 * d, rngs=rngs),
            nnx.swish,
            nnx.Linear(4 * d, d, rngs=rngs),
        )
        self.ln_out = nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, x, mask):
        x = x + 0.5 * self.ff1(x)
        h = self.ln_att(x)
        x = x + self.att(h, mask=mask)
        h = jax.nn.glu(self.pw1(self.ln_conv(x)), axis=-1)
        x = x + self.pw2(nnx.swish(self.bn(self.dw(h))))
        x = x + 0.5 * self.ff2(x)
        return self.ln_out(x)


class Conformer(nnx.Module):
    def __init__(self, *, rngs):
        self.sub = nnx.Conv(8, 16, (3,), strides=2, rngs=rngs)
        self.blocks = nnx.List([ConformerBlock(16, rngs=rngs) for _ in range(2)])
        self.ctc = nnx.Linear(16, 6, rngs=rngs)

    def __call__(self, feats, lengths):
        x = self.sub(feats)
        valid = jnp.arange(x.shape[1])[None] < (lengths[:, None] + 1) // 2
        mask = nnx.make_attention_mask(valid, valid)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.ctc(x), valid


def conformer():
    feats = jax.random.normal(_key(1), (3, 16, 8))
    lengths = jnp.array([16, 12, 9])
    labels = jax.random.randint(_key(2), (3, 8), 0, 6)

    def loss(m, feats, lengths, labels):
        logits, valid = m(feats, lengths)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return jnp.sum(ce * valid) / jnp.sum(valid)

    return _case(
        "conformer",
        lambda: Conformer(rngs=nnx.Rngs(0)),
        _metrics(loss),
        (feats, lengths, labels),
        "conformer",
    )


class Switchy(nnx.Module):
    def __init__(self, *, rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 16, rngs=rngs)
        self.l3 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x, which):
        h = self.l1(x)
        h = jax.lax.switch(which, [jax.nn.relu, jnp.tanh, lambda v: self.l2(v)], h)
        return self.l3(h)


def switch():
    x = jax.random.normal(_key(1), (8, 8))
    y = jax.random.randint(_key(2), (8,), 0, 2)

    def loss(m, x, w, y):
        return optax.softmax_cross_entropy_with_integer_labels(m(x, w), y).mean()

    return _case(
        "switch",
        lambda: Switchy(rngs=nnx.Rngs(0)),
        _metrics(loss),
        (x, jnp.int32(2), y),
        "lax.switch",
    )


class Circular(nnx.Module):
    def __init__(self, *, rngs):
        self.c1 = nnx.Conv(2, 8, (3, 3), padding="CIRCULAR", rngs=rngs)
        self.c2 = nnx.Conv(8, 8, (3, 3), padding="CIRCULAR", rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.bn(self.c1(x)))
        h = nnx.max_pool(h, (2, 2), strides=(2, 2))
        h = nnx.gelu(self.c2(h))
        h = nnx.avg_pool(h, (2, 2), strides=(1, 1), padding="SAME")
        return self.out(h.mean((1, 2)))


def circular():
    x = jax.random.normal(_key(1), (4, 8, 8, 2))
    y = jax.random.randint(_key(2), (4,), 0, 3)
    return _case(
        "circular", lambda: Circular(rngs=nnx.Rngs(0)), _metrics(classify), (x, y), "circular"
    )


class QAT(nnx.Module):
    def __init__(self, *, rngs):
        self.l1 = nnx.Linear(8, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 2, rngs=rngs)

    def __call__(self, x):
        w = self.l1.kernel[...]
        wq = w + jax.lax.stop_gradient(
            jax.lax.reduce_precision(w, exponent_bits=4, mantissa_bits=3) - w
        )
        h = jax.nn.relu(x @ wq + self.l1.bias[...])
        h = jax.lax.reduce_precision(h, exponent_bits=5, mantissa_bits=10)
        return self.l2(h)


def qat():
    x = jax.random.normal(_key(1), (8, 8))
    y = jax.random.randint(_key(2), (8,), 0, 2)
    return _case(
        "qat", lambda: QAT(rngs=nnx.Rngs(0)), _metrics(classify), (x, y), "reduce_precision"
    )


class MaskedAttn(nnx.Module):
    def __init__(self, *, rngs):
        self.qkv = nnx.Linear(16, 48, rngs=rngs)
        self.o = nnx.Linear(16, 16, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((2, 6, 6)))
        self.head = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x, valid):
        b, t, _ = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(b, t, 2, 24), 3, -1)
        mask = valid[:, None, None, :] & valid[:, None, :, None]
        out = jax.nn.dot_product_attention(q, k, v, bias=self.bias[...][None], mask=mask)
        out = jnp.where(valid[..., None, None], out, 0.0)
        h = self.o(out.reshape(b, t, 16))
        pooled = jnp.sum(h * valid[..., None], 1) / jnp.maximum(valid.sum(1, keepdims=True), 1)
        return self.head(pooled)


def masked_attn():
    x = jax.random.normal(_key(1), (3, 6, 16))
    valid = jnp.arange(6)[None] < jnp.array([6, 3, 0])[:, None]  # one sequence fully masked
    y = jnp.array([0, 1, 1])

    def loss(m, x, v, y):
        return optax.softmax_cross_entropy_with_integer_labels(m(x, v), y).mean()

    return _case(
        "masked_attn",
        lambda: MaskedAttn(rngs=nnx.Rngs(0)),
        _metrics(loss),
        (x, valid, y),
        "dpa bias+mask",
    )


ARCH_CASES: dict[str, Callable[[], Case]] = {
    f.__name__: f for f in (gat, ragged_moe, dit, conformer, switch, circular, qat, masked_attn)
}
