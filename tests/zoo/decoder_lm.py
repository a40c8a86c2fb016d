"""A Llama-style decoder-only language model as Flax NNX ports of Llama/Mistral write it:
rotary position embeddings (cos/sin tables built with ``jnp.concatenate``, gathered at the
``positions`` argument, rotate-half), grouped-query attention (fewer KV heads, ``jnp.repeat``),
RMSNorm, a SwiGLU MLP, a causal sliding-window mask (Mistral), tied input/output embeddings,
and a KV cache passed as an argument: a tuple of per-layer ``{"k", "v"}`` dicts of fixed
shape, zero-filled in training, that each layer writes into with
``jax.lax.dynamic_update_slice`` at the offset ``positions[0, 0]`` and attends over."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class LlamaConfig:
    vocab_size: int = 64
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 128
    max_seq_len: int = 24  # cache length
    sliding_window: int = 8
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        self.weight = nnx.Param(jnp.ones((dim,)))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return normed.astype(x.dtype) * self.weight[...]


def rope_tables(head_dim: int, max_len: int, theta: float):
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jnp.outer(jnp.arange(max_len, dtype=jnp.float32), inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # (max_len, head_dim)
    return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x, cos, sin):  # x: (b, t, h, d); cos/sin: (b, t, d)
    return x * cos[:, :, None, :] + rotate_half(x) * sin[:, :, None, :]


class Attention(nnx.Module):
    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nnx.Linear(cfg.dim, cfg.n_heads * hd, use_bias=False, rngs=rngs)
        self.wk = nnx.Linear(cfg.dim, cfg.n_kv_heads * hd, use_bias=False, rngs=rngs)
        self.wv = nnx.Linear(cfg.dim, cfg.n_kv_heads * hd, use_bias=False, rngs=rngs)
        self.wo = nnx.Linear(cfg.n_heads * hd, cfg.dim, use_bias=False, rngs=rngs)

    def __call__(self, x, cos, sin, positions, cache=None):
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.wq(x).reshape(b, t, cfg.n_heads, cfg.head_dim)
        k = self.wk(x).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        v = self.wv(x).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        if cache is not None:  # write this chunk at its offset, attend over the whole cache
            start = positions[0, 0]
            k = jax.lax.dynamic_update_slice(cache["k"], k, (0, start, 0, 0))
            v = jax.lax.dynamic_update_slice(cache["v"], v, (0, start, 0, 0))
            cache = {"k": k, "v": v}
            k_pos = jnp.arange(k.shape[1])[None, :]
        else:
            k_pos = positions

        rep = cfg.n_heads // cfg.n_kv_heads  # grouped-query attention
        k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)

        q_pos = positions[:, :, None]
        k_pos = k_pos[:, None, :]
        mask = (k_pos <= q_pos) & (q_pos - k_pos < cfg.sliding_window)  # (b, t, s)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(cfg.head_dim).astype(q.dtype)
        scores = jnp.where(mask[:, None], scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
        out = jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1)
        return self.wo(out), cache


class FeedForward(nnx.Module):
    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.w1 = nnx.Linear(cfg.dim, cfg.ffn_dim, use_bias=False, rngs=rngs)
        self.w3 = nnx.Linear(cfg.dim, cfg.ffn_dim, use_bias=False, rngs=rngs)
        self.w2 = nnx.Linear(cfg.ffn_dim, cfg.dim, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.w2(jax.nn.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nnx.Module):
    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, rngs=rngs)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, positions, cache=None):
        h, cache = self.attention(self.attention_norm(x), cos, sin, positions, cache)
        x = x + h
        return x + self.feed_forward(self.ffn_norm(x)), cache


class Llama(nnx.Module):
    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tok_embeddings = nnx.Embed(cfg.vocab_size, cfg.dim, rngs=rngs)
        self.layers = nnx.List([TransformerBlock(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def __call__(self, tokens, cache=None, positions=None):
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t)[None], (b, t))
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta)
        cos, sin = cos[positions], sin[positions]
        h = self.tok_embeddings(tokens)
        new_cache = []
        for i, layer in enumerate(self.layers):
            h, c = layer(h, cos, sin, positions, None if cache is None else cache[i])
            new_cache.append(c)
        logits = self.tok_embeddings.attend(self.norm(h))  # tied output embedding
        return logits, (tuple(new_cache) if cache is not None else None)


def init_cache(cfg: LlamaConfig, batch: int):
    shape = (batch, cfg.max_seq_len, cfg.n_kv_heads, cfg.head_dim)
    return tuple({"k": jnp.zeros(shape), "v": jnp.zeros(shape)} for _ in range(cfg.n_layers))


def make(seed: int = 0, cfg: LlamaConfig | None = None) -> Case:
    cfg = cfg or LlamaConfig()
    b, t, offset = 2, 12, 4
    key = jax.random.key(seed + 1)
    seq = jax.random.randint(key, (b, t + 1), 0, cfg.vocab_size)
    tokens, labels = seq[:, :-1], seq[:, 1:]
    positions = jnp.broadcast_to(offset + jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    cache = init_cache(cfg, b)

    def loss_fn(model, tokens, labels, cache, positions):
        logits, _ = model(tokens, cache=cache, positions=positions)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, tokens, labels, cache, positions):
        logits, new_cache = model(tokens, cache=cache, positions=positions)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        acc = jnp.mean(jnp.argmax(logits, axis=-1) == labels)
        filled = jnp.mean(jnp.any(new_cache[0]["k"] != 0, axis=(2, 3)))
        return loss, {"loss": loss, "accuracy": acc, "cache_filled": filled}

    return Case(
        name="decoder_lm",
        factory=lambda: Llama(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(tokens, labels, cache, positions),
        notes="RoPE (concatenated cos/sin tables gathered at positions), GQA with jnp.repeat, "
        "RMSNorm (float32 upcast), SwiGLU, causal sliding-window mask, tied embeddings, "
        "KV-cache argument (tuple of dicts) written with dynamic_update_slice at a traced "
        "offset",
    )
