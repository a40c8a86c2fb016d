"""A Whisper-style speech encoder-decoder (Radford et al., 2022) as Flax NNX ports write it:
the audio encoder runs two conv1d layers over a log-mel input ``(batch, frames, mels)``
(kernel 3, the second with stride 2, GELU), adds fixed sinusoidal positions (held as a
non-parameter ``nnx.Variable``, like Whisper's buffer) and pre-LayerNorm self-attention
blocks (query/value projections with bias, key without); the text decoder has token
embeddings and learned positions, causal self-attention (an additive ``-inf`` upper
triangle, as Whisper builds it), cross-attention to the audio features, and logits from the
tied token embedding."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import Case


@dataclass
class WhisperConfig:
    n_mels: int = 16
    n_audio_ctx: int = 8  # frames after the stride-2 conv
    n_audio_state: int = 32
    n_audio_head: int = 4
    n_audio_layer: int = 2
    n_vocab: int = 64
    n_text_ctx: int = 16
    n_text_state: int = 32
    n_text_head: int = 4
    n_text_layer: int = 2


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0):
    log_timescale_increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = jnp.exp(-log_timescale_increment * jnp.arange(channels // 2))
    scaled_time = jnp.arange(length)[:, None] * inv_timescales[None, :]
    return jnp.concatenate([jnp.sin(scaled_time), jnp.cos(scaled_time)], axis=1)


class MultiHeadAttention(nnx.Module):
    def __init__(self, n_state: int, n_head: int, *, rngs: nnx.Rngs):
        self.n_head = n_head
        self.query = nnx.Linear(n_state, n_state, rngs=rngs)
        self.key = nnx.Linear(n_state, n_state, use_bias=False, rngs=rngs)
        self.value = nnx.Linear(n_state, n_state, rngs=rngs)
        self.out = nnx.Linear(n_state, n_state, rngs=rngs)

    def __call__(self, x, xa=None, mask=None):
        kv = x if xa is None else xa
        q, k, v = self.query(x), self.key(kv), self.value(kv)
        b, t, d = q.shape
        scale = (d // self.n_head) ** -0.25
        q = q.reshape(b, t, self.n_head, -1).transpose(0, 2, 1, 3) * scale
        k = k.reshape(b, k.shape[1], self.n_head, -1).transpose(0, 2, 3, 1) * scale
        v = v.reshape(b, v.shape[1], self.n_head, -1).transpose(0, 2, 1, 3)
        qk = q @ k
        if mask is not None:
            qk = qk + mask[:t, :t]
        w = jax.nn.softmax(qk.astype(jnp.float32), axis=-1).astype(q.dtype)
        return self.out((w @ v).transpose(0, 2, 1, 3).reshape(b, t, d))


class ResidualAttentionBlock(nnx.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool, *, rngs: nnx.Rngs):
        self.attn = MultiHeadAttention(n_state, n_head, rngs=rngs)
        self.attn_ln = nnx.LayerNorm(n_state, rngs=rngs)
        self.cross_attn = (
            MultiHeadAttention(n_state, n_head, rngs=rngs) if cross_attention else None
        )
        self.cross_attn_ln = nnx.LayerNorm(n_state, rngs=rngs) if cross_attention else None
        self.mlp1 = nnx.Linear(n_state, 4 * n_state, rngs=rngs)
        self.mlp2 = nnx.Linear(4 * n_state, n_state, rngs=rngs)
        self.mlp_ln = nnx.LayerNorm(n_state, rngs=rngs)

    def __call__(self, x, xa=None, mask=None):
        x = x + self.attn(self.attn_ln(x), mask=mask)
        if self.cross_attn is not None:
            x = x + self.cross_attn(self.cross_attn_ln(x), xa)
        return x + self.mlp2(nnx.gelu(self.mlp1(self.mlp_ln(x)), approximate=False))


class AudioEncoder(nnx.Module):
    def __init__(self, cfg: WhisperConfig, *, rngs: nnx.Rngs):
        d = cfg.n_audio_state
        self.conv1 = nnx.Conv(cfg.n_mels, d, kernel_size=(3,), padding=1, rngs=rngs)
        self.conv2 = nnx.Conv(d, d, kernel_size=(3,), strides=(2,), padding=1, rngs=rngs)
        self.positional_embedding = nnx.Variable(sinusoids(cfg.n_audio_ctx, d))
        self.blocks = nnx.List(
            [
                ResidualAttentionBlock(d, cfg.n_audio_head, False, rngs=rngs)
                for _ in range(cfg.n_audio_layer)
            ]
        )
        self.ln_post = nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, mel):  # (batch, frames, mels)
        x = nnx.gelu(self.conv1(mel), approximate=False)
        x = nnx.gelu(self.conv2(x), approximate=False)
        x = x + self.positional_embedding[...][: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class TextDecoder(nnx.Module):
    def __init__(self, cfg: WhisperConfig, *, rngs: nnx.Rngs):
        d = cfg.n_text_state
        self.token_embedding = nnx.Embed(cfg.n_vocab, d, rngs=rngs)
        self.positional_embedding = nnx.Param(jnp.zeros((cfg.n_text_ctx, d)))
        self.blocks = nnx.List(
            [
                ResidualAttentionBlock(d, cfg.n_text_head, True, rngs=rngs)
                for _ in range(cfg.n_text_layer)
            ]
        )
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.n_ctx = cfg.n_text_ctx

    def __call__(self, tokens, xa):
        t = tokens.shape[1]
        x = self.token_embedding(tokens) + self.positional_embedding[...][:t]
        mask = jnp.triu(jnp.full((self.n_ctx, self.n_ctx), -jnp.inf), k=1)
        for block in self.blocks:
            x = block(x, xa, mask=mask)
        x = self.ln(x)
        return self.token_embedding.attend(x)  # tied output embedding


class Whisper(nnx.Module):
    def __init__(self, cfg: WhisperConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoder = AudioEncoder(cfg, rngs=rngs)
        self.decoder = TextDecoder(cfg, rngs=rngs)

    def __call__(self, mel, tokens):
        return self.decoder(tokens, self.encoder(mel))


def make(seed: int = 0, cfg: WhisperConfig | None = None) -> Case:
    cfg = cfg or WhisperConfig()
    key = jax.random.key(seed + 1)
    mel = jax.random.normal(key, (2, 2 * cfg.n_audio_ctx, cfg.n_mels))  # log-mel-like
    seq = jax.random.randint(jax.random.fold_in(key, 1), (2, 11), 0, cfg.n_vocab)
    tokens, labels = seq[:, :-1], seq[:, 1:]

    def loss_fn(model, mel, tokens, labels):
        logits = model(mel, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, mel, tokens, labels):
        logits = model(mel, tokens)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

    return Case(
        name="audio",
        factory=lambda: Whisper(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(mel, tokens, labels),
        notes="conv1d stem (stride 2) with exact GELU, sinusoidal positions in a non-param "
        "nnx.Variable, q/k scaled by d^-1/4, key projection without bias, -inf additive "
        "causal mask, cross-attention, optional (None) submodules, tied embeddings",
    )
