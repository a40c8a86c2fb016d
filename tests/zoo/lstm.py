"""A bidirectional LSTM sequence tagger (BiLSTM, as in classic POS/NER taggers) written with
the Flax NNX recurrent API: token embeddings with dropout, a bidirectional layer
(``nnx.Bidirectional`` of two ``nnx.RNN(nnx.OptimizedLSTMCell)``) over padded sequences
with ``seq_lengths`` (an argument), a second unidirectional ``nnx.RNN`` layer, and a
per-token tag classifier; the cross-entropy is averaged over the real (unpadded) tokens."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class TaggerConfig:
    vocab_size: int = 64
    embed_dim: int = 16
    hidden: int = 32
    num_tags: int = 8
    dropout: float = 0.1


class BiLSTMTagger(nnx.Module):
    def __init__(self, cfg: TaggerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        h = cfg.hidden
        self.embed = nnx.Embed(cfg.vocab_size, cfg.embed_dim, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.bilstm = nnx.Bidirectional(
            nnx.RNN(nnx.OptimizedLSTMCell(cfg.embed_dim, h, rngs=rngs)),
            nnx.RNN(nnx.OptimizedLSTMCell(cfg.embed_dim, h, rngs=rngs)),
        )
        self.lstm2 = nnx.RNN(nnx.OptimizedLSTMCell(2 * h, h, rngs=rngs))
        self.classifier = nnx.Linear(h, cfg.num_tags, rngs=rngs)

    def __call__(self, tokens, seq_lengths):
        x = self.dropout(self.embed(tokens))
        x = self.bilstm(x, seq_lengths=seq_lengths)
        x = self.lstm2(self.dropout(x), seq_lengths=seq_lengths)
        return self.classifier(self.dropout(x))


def make(seed: int = 0, cfg: TaggerConfig | None = None) -> Case:
    cfg = cfg or TaggerConfig()
    b, t = 3, 12
    key = jax.random.key(seed + 1)
    seq_lengths = jnp.array([12, 9, 6], dtype=jnp.int32)
    valid = jnp.arange(t)[None] < seq_lengths[:, None]
    tokens = jnp.where(valid, jax.random.randint(key, (b, t), 1, cfg.vocab_size), 0)
    tags = jax.random.randint(jax.random.fold_in(key, 1), (b, t), 0, cfg.num_tags)
    weights = valid.astype(jnp.float32)

    def loss_fn(model, tokens, seq_lengths, tags, weights):
        logits = model(tokens, seq_lengths)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tags)
        return jnp.sum(ce * weights) / jnp.sum(weights)

    def aux_loss_fn(model, tokens, seq_lengths, tags, weights):
        logits = model(tokens, seq_lengths)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tags)
        loss = jnp.sum(ce * weights) / jnp.sum(weights)
        acc = jnp.sum((jnp.argmax(logits, -1) == tags) * weights) / jnp.sum(weights)
        return loss, {"loss": loss, "token_accuracy": acc}

    return Case(
        name="lstm",
        factory=lambda: BiLSTMTagger(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(tokens, seq_lengths, tags, weights),
        notes="nnx.Bidirectional + nnx.RNN over nnx.OptimizedLSTMCell (scan inside), "
        "seq_lengths argument (reverse with padding), dropout, masked per-token loss",
    )
