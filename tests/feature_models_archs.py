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
  under which one sequence has no valid token (its rows masked out after);
- ``rwkv``: RWKV-style time mixing (a token shift by ``pad``, a ``lax.scan`` of
  exponentially decayed sums with learnable decay and bonus), tied embeddings by
  ``Embed.attend``;
- ``llama``: rotary embeddings by a complex multiply (``lax.complex``, ``real``,
  ``imag``), grouped-query attention by ``jnp.repeat`` into causal
  ``dot_product_attention``, a SwiGLU MLP, RMSNorm, tied embeddings, logit soft-capping
  by ``tanh``;
- ``hyena``: a long convolution by zero-padded ``rfft`` / ``irfft`` with an implicit
  filter (an MLP over positions with ``jnp.sin`` in ``nnx.Sequential``), gated;
- ``yolo``: a detector's box loss by ``1 - IoU`` (``clip``, ``minimum``, ``maximum``,
  exponentiated sizes) over the cells that hold an object, an objectness
  ``sigmoid_binary_cross_entropy``, BatchNorm, a strided convolution;
- ``grid``: grid attention over a window partition by ``reshape`` / ``transpose`` with a
  learnable bias per head, optax's ``sigmoid_focal_loss`` of smoothed labels.

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
from feature_models import _key, classify
from feature_models_science import _made
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

    return _made("gat", GAT, loss, (x, src, dst, y), "segment_max/sum")


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

    return _made("ragged_moe", RaggedMoE, loss, (x, y), "ragged_dot")


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

    return _made("dit", DiT, loss, (x0, noise, t, y, drop), "adaLN-Zero")


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

    return _made("conformer", Conformer, loss, (feats, lengths, labels), "conformer")


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

    return _made("switch", Switchy, loss, (x, jnp.int32(2), y), "lax.switch")


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
    return _made("circular", Circular, classify, (x, y), "circular")


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
    return _made("qat", QAT, classify, (x, y), "reduce_precision")


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

    return _made("masked_attn", MaskedAttn, loss, (x, valid, y), "dpa bias+mask")


class RWKVMix(nnx.Module):
    def __init__(self, d, *, rngs):
        self.mu = nnx.Param(jnp.full((d,), 0.5))
        self.k = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.r = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.decay = nnx.Param(jnp.linspace(-1.0, -3.0, d))
        self.bonus = nnx.Param(jnp.zeros((d,)))
        self.o = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.ln = nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, x):
        h = self.ln(x)
        prev = jnp.pad(h, ((0, 0), (1, 0), (0, 0)))[:, :-1]
        xm = h * self.mu[...] + prev * (1 - self.mu[...])
        k, v, r = self.k(xm), self.v(xm), jax.nn.sigmoid(self.r(xm))
        w = -jnp.exp(self.decay[...])

        def step(carry, inp):
            num, den = carry
            kt, vt = inp
            e = jnp.exp(self.bonus[...] + kt)
            out = (num + e * vt) / (den + e)
            num = jnp.exp(w) * num + jnp.exp(kt) * vt
            den = jnp.exp(w) * den + jnp.exp(kt)
            return (num, den), out

        z = jnp.zeros_like(k[:, 0])
        _, out = jax.lax.scan(step, (z, z), (k.swapaxes(0, 1), v.swapaxes(0, 1)))
        return x + self.o(r * out.swapaxes(0, 1))


class RWKV(nnx.Module):
    def __init__(self, *, rngs):
        self.embed = nnx.Embed(32, 16, rngs=rngs)
        self.blocks = nnx.List([RWKVMix(16, rngs=rngs) for _ in range(2)])
        self.ln = nnx.LayerNorm(16, rngs=rngs)

    def __call__(self, t):
        h = self.embed(t)
        for b in self.blocks:
            h = b(h)
        return self.embed.attend(self.ln(h))


def rwkv():
    t = jax.random.randint(_key(1), (2, 8), 0, 32)

    def loss(m, t):
        logits = m(t[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, t[:, 1:]).mean()

    return _made("rwkv", RWKV, loss, (t,), "rwkv")


def rope_complex(x, pos):
    d = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (jnp.arange(d) / d))
    angles = pos[:, None] * freqs[None]
    rot = jax.lax.complex(jnp.cos(angles), jnp.sin(angles))
    xc = jax.lax.complex(x[..., :d], x[..., d:]) * rot[None, :, None, :]
    return jnp.concatenate([jnp.real(xc), jnp.imag(xc)], -1)


class Llama(nnx.Module):
    def __init__(self, *, rngs, d=32, heads=4, kv=2):
        self.embed = nnx.Embed(40, d, rngs=rngs)
        self.q = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.kv = nnx.Linear(d, 2 * kv * (d // heads), use_bias=False, rngs=rngs)
        self.o = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.n1 = nnx.RMSNorm(d, rngs=rngs)
        self.n2 = nnx.RMSNorm(d, rngs=rngs)
        self.n3 = nnx.RMSNorm(d, rngs=rngs)
        self.gate = nnx.Linear(d, 64, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(d, 64, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(64, d, use_bias=False, rngs=rngs)
        self.heads, self.kvh, self.hd = heads, kv, d // heads

    def __call__(self, t):
        b, s = t.shape
        x = self.embed(t)
        h = self.n1(x)
        q = self.q(h).reshape(b, s, self.heads, self.hd)
        k, v = jnp.split(self.kv(h).reshape(b, s, 2 * self.kvh, self.hd), 2, 2)
        pos = jnp.arange(s, dtype=jnp.float32)
        q, k = rope_complex(q, pos), rope_complex(k, pos)
        k = jnp.repeat(k, self.heads // self.kvh, 2)
        v = jnp.repeat(v, self.heads // self.kvh, 2)
        att = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.reshape(b, s, -1))
        h = self.n2(x)
        x = x + self.down(jax.nn.silu(self.gate(h)) * self.up(h))
        logits = self.embed.attend(self.n3(x))
        return 30.0 * jnp.tanh(logits / 30.0)  # soft-capping


def llama():
    t = jax.random.randint(_key(2), (2, 9), 0, 40)

    def loss(m, t):
        return optax.softmax_cross_entropy_with_integer_labels(m(t[:, :-1]), t[:, 1:]).mean()

    return _made("llama", Llama, loss, (t,), "rope complex")


class Hyena(nnx.Module):
    def __init__(self, *, rngs, d=8, n=16):
        self.inp = nnx.Linear(d, 3 * d, rngs=rngs)
        self.filt = nnx.Sequential(
            nnx.Linear(3, 16, rngs=rngs), jnp.sin, nnx.Linear(16, d, rngs=rngs)
        )
        self.out = nnx.Linear(d, d, rngs=rngs)
        self.head = nnx.Linear(d, 2, rngs=rngs)
        self.n = n

    def __call__(self, x):
        n = x.shape[1]
        a, b, v = jnp.split(self.inp(x), 3, -1)
        t = jnp.linspace(0, 1, n)[:, None]
        h = self.filt(jnp.concatenate([t, jnp.sin(3 * t), jnp.cos(3 * t)], -1)) * jnp.exp(-3 * t)
        vf = jnp.fft.rfft(a * v, n=2 * n, axis=1)
        hf = jnp.fft.rfft(h, n=2 * n, axis=0)
        y = jnp.fft.irfft(vf * hf[None], n=2 * n, axis=1)[:, :n]
        return self.head(self.out(b * y).mean(1))


def hyena():
    x = jax.random.normal(_key(3), (3, 16, 8))
    y = jnp.array([0, 1, 1])

    def loss(m, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    return _made("hyena", Hyena, loss, (x, y), "fft conv")


class Detector(nnx.Module):
    def __init__(self, *, rngs):
        self.c1 = nnx.Conv(3, 8, (3, 3), strides=2, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.c2 = nnx.Conv(8, 8, (3, 3), rngs=rngs)
        self.box = nnx.Conv(8, 4, (1, 1), rngs=rngs)
        self.obj = nnx.Conv(8, 1, (1, 1), rngs=rngs)

    def __call__(self, x):
        h = nnx.silu(self.bn(self.c1(x)))
        h = nnx.silu(self.c2(h))
        return self.box(h), self.obj(h)[..., 0]


def iou(a, b):
    ax1, ay1, ax2, ay2 = (
        a[..., 0],
        a[..., 1],
        a[..., 0] + jnp.exp(a[..., 2]),
        a[..., 1] + jnp.exp(a[..., 3]),
    )
    bx1, by1, bx2, by2 = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    iw = jnp.clip(jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1), 0)
    ih = jnp.clip(jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1), 0)
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / (union + 1e-7)


def yolo():
    x = jax.random.normal(_key(4), (2, 8, 8, 3))
    lo = jax.random.uniform(_key(5), (2, 4, 4, 2))
    boxes = jnp.concatenate([lo, lo + 0.5 + jax.random.uniform(_key(6), (2, 4, 4, 2))], -1)
    has = (jax.random.uniform(_key(7), (2, 4, 4)) < 0.3).astype(jnp.float32)

    def loss(m, x, boxes, has):
        pb, po = m(x)
        box = jnp.sum((1 - iou(pb, boxes)) * has) / jnp.maximum(has.sum(), 1)
        obj = optax.sigmoid_binary_cross_entropy(po, has).mean()
        return box + obj

    return _made("yolo", Detector, loss, (x, boxes, has), "iou")


class GridAttn(nnx.Module):
    def __init__(self, *, rngs, c=8):
        self.qkv = nnx.Linear(c, 3 * c, rngs=rngs)
        self.o = nnx.Linear(c, c, rngs=rngs)
        self.rel = nnx.Param(jnp.zeros((2, 16, 16)))
        self.ln = nnx.LayerNorm(c, rngs=rngs)
        self.head = nnx.Linear(c, 3, rngs=rngs)

    def __call__(self, x):  # (b, 8, 8, c): grid of 2x2 groups of 4x4 windows
        b, H, W, c = x.shape
        g = x.reshape(b, 4, 2, 4, 2, c).transpose(0, 2, 4, 1, 3, 5).reshape(b * 4, 16, c)
        q, k, v = jnp.split(self.qkv(self.ln(g)), 3, -1)
        q = q.reshape(b * 4, 16, 2, c // 2)
        k = k.reshape(b * 4, 16, 2, c // 2)
        v = v.reshape(b * 4, 16, 2, c // 2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(c / 2) + self.rel[...]
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(b * 4, 16, c)
        g = g + self.o(a)
        x = g.reshape(b, 2, 2, 4, 4, c).transpose(0, 3, 1, 4, 2, 5).reshape(b, H, W, c)
        return self.head(x.mean((1, 2)))


def grid():
    x = jax.random.normal(_key(8), (2, 8, 8, 8))
    y = jnp.array([0, 2])

    def loss(m, x, y):
        logits = m(x)
        labels = optax.smooth_labels(jax.nn.one_hot(y, 3), 0.1)
        return optax.sigmoid_focal_loss(logits, labels).mean()

    return _made("grid", GridAttn, loss, (x, y), "grid attention, focal")


ARCH_CASES: dict[str, Callable[[], Case]] = {
    f.__name__: f
    for f in (
        gat,
        ragged_moe,
        dit,
        conformer,
        switch,
        circular,
        qat,
        masked_attn,
        rwkv,
        llama,
        hyena,
        yolo,
        grid,
    )
}
