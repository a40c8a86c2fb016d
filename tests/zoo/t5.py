"""A T5-style encoder-decoder as Flax NNX users write it (after the public T5 ports):
a config dataclass held by the module, RMS layer norms without bias, relative position
bias (log-spaced buckets) computed once per stack and shared by its layers,
cross-attention, dropout in training mode, tied input/output embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class T5Config:
    vocab: int = 64
    width: int = 64
    heads: int = 4
    ff: int = 128
    layers: int = 2
    buckets: int = 8
    max_distance: int = 16
    dropout: float = 0.1


class T5LayerNorm(nnx.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((width,)))
        self.eps = eps

    def __call__(self, x):
        var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(var + self.eps) * self.scale[...]


def relative_bucket(relative, bidirectional: bool, buckets: int, max_distance: int):
    ret = 0
    n = -relative
    if bidirectional:
        buckets //= 2
        ret += (n < 0).astype(jnp.int32) * buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        jnp.log(n.astype(jnp.float32) / max_exact + 1e-6)
        / math.log(max_distance / max_exact)
        * (buckets - max_exact)
    ).astype(jnp.int32)
    large = jnp.minimum(large, buckets - 1)
    return ret + jnp.where(is_small, n, large)


class Attention(nnx.Module):
    def __init__(self, cfg: T5Config, *, bias: bool, bidirectional: bool, rngs: nnx.Rngs):
        self.cfg = cfg
        self.bidirectional = bidirectional
        self.q = nnx.Linear(cfg.width, cfg.width, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(cfg.width, cfg.width, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(cfg.width, cfg.width, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(cfg.width, cfg.width, use_bias=False, rngs=rngs)
        self.rel = nnx.Embed(cfg.buckets, cfg.heads, rngs=rngs) if bias else None
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def position_bias(self, q_len: int, k_len: int):
        ctx = jnp.arange(q_len)[:, None]
        mem = jnp.arange(k_len)[None, :]
        buckets = relative_bucket(
            mem - ctx, self.bidirectional, self.cfg.buckets, self.cfg.max_distance
        )
        return jnp.transpose(self.rel(buckets), (2, 0, 1))[None]  # (1, heads, q, k)

    def __call__(self, x, kv, bias, mask=None):
        b, t, _ = x.shape
        h = self.cfg.heads
        split = lambda y: y.reshape(b, -1, h, self.cfg.width // h)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(kv)), split(self.v(kv))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias
        if mask is not None:
            scores = jnp.where(mask, scores, -1e9)
        weights = self.drop(jax.nn.softmax(scores, axis=-1))
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, -1)
        return self.o(out)


class FeedForward(nnx.Module):
    def __init__(self, cfg: T5Config, rngs: nnx.Rngs):
        self.wi = nnx.Linear(cfg.width, cfg.ff, use_bias=False, rngs=rngs)
        self.wo = nnx.Linear(cfg.ff, cfg.width, use_bias=False, rngs=rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x):
        return self.wo(self.drop(jax.nn.relu(self.wi(x))))


class EncoderLayer(nnx.Module):
    def __init__(self, cfg: T5Config, first: bool, rngs: nnx.Rngs):
        self.norm1 = T5LayerNorm(cfg.width)
        self.attn = Attention(cfg, bias=first, bidirectional=True, rngs=rngs)
        self.norm2 = T5LayerNorm(cfg.width)
        self.ff = FeedForward(cfg, rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x, bias):
        y = self.norm1(x)
        x = x + self.drop(self.attn(y, y, bias))
        return x + self.drop(self.ff(self.norm2(x)))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: T5Config, first: bool, rngs: nnx.Rngs):
        self.norm1 = T5LayerNorm(cfg.width)
        self.self_attn = Attention(cfg, bias=first, bidirectional=False, rngs=rngs)
        self.norm2 = T5LayerNorm(cfg.width)
        self.cross = Attention(cfg, bias=False, bidirectional=True, rngs=rngs)
        self.norm3 = T5LayerNorm(cfg.width)
        self.ff = FeedForward(cfg, rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x, enc, bias, mask):
        y = self.norm1(x)
        x = x + self.drop(self.self_attn(y, y, bias, mask))
        x = x + self.drop(self.cross(self.norm2(x), enc, 0.0))
        return x + self.drop(self.ff(self.norm3(x)))


class T5(nnx.Module):
    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab, cfg.width, rngs=rngs)
        self.encoder = nnx.List([EncoderLayer(cfg, i == 0, rngs) for i in range(cfg.layers)])
        self.enc_norm = T5LayerNorm(cfg.width)
        self.decoder = nnx.List([DecoderLayer(cfg, i == 0, rngs) for i in range(cfg.layers)])
        self.dec_norm = T5LayerNorm(cfg.width)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, src, tgt):
        x = self.drop(self.embed(src))
        bias = self.encoder[0].attn.position_bias(src.shape[1], src.shape[1])
        for layer in self.encoder:
            x = layer(x, bias)
        enc = self.drop(self.enc_norm(x))
        y = self.drop(self.embed(tgt))
        t = tgt.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))[None, None]
        bias = self.decoder[0].self_attn.position_bias(t, t)
        for layer in self.decoder:
            y = layer(y, enc, bias, mask)
        y = self.drop(self.dec_norm(y)) * (self.cfg.width**-0.5)
        return self.embed.attend(y)  # tied output embedding


def make(seed: int = 0, cfg: T5Config | None = None) -> Case:
    cfg = cfg or T5Config()
    key = jax.random.key(seed + 1)
    src = jax.random.randint(key, (2, 12), 0, cfg.vocab)
    tgt = jax.random.randint(jax.random.fold_in(key, 1), (2, 10), 0, cfg.vocab)
    labels = jnp.roll(tgt, -1, axis=1)

    def loss_fn(model, src, tgt, labels):
        logits = model(src, tgt)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))

    def aux_loss_fn(model, src, tgt, labels):
        logits = model(src, tgt)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        acc = jnp.mean(jnp.argmax(logits, -1) == labels)
        return loss, {"loss": loss, "accuracy": acc}

    return Case(
        name="t5",
        factory=lambda: T5(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(src, tgt, labels),
        notes="encoder-decoder, relative position bias (log buckets) shared per stack, "
        "RMS norms, cross-attention, causal mask, dropout (training), tied embeddings",
    )
