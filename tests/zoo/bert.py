"""A BERT masked-language model (Devlin et al.) as the Flax NNX / HF-style ports write it:
word + position + token-type embeddings with LayerNorm and dropout, post-LayerNorm encoder
layers with hand-written self-attention and the extended padding mask
``(1 - mask[:, None, None, :]) * -10000`` built from the ``attention_mask`` argument, GELU
intermediate layers, an MLM head (dense + GELU + LayerNorm, decoder tied to the word
embeddings plus an output bias); the MLM loss is averaged over the masked positions and
weighted by a learnable uncertainty weight ``log_var`` (an ``nnx.Param`` read in the loss
after the model call: ``loss * exp(-log_var) + log_var``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class BertConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 64
    max_position_embeddings: int = 16
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    mask_token_id: int = 3
    pad_token_id: int = 0


class BertEmbeddings(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.word_embeddings = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)
        self.position_embeddings = nnx.Embed(
            cfg.max_position_embeddings, cfg.hidden_size, rngs=rngs
        )
        self.token_type_embeddings = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size, rngs=rngs)
        self.LayerNorm = nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.hidden_dropout_prob, rngs=rngs)

    def __call__(self, input_ids, token_type_ids):
        position_ids = jnp.arange(input_ids.shape[1])[None, :]
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(position_ids)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.head_size = d // cfg.num_attention_heads
        self.query = nnx.Linear(d, d, rngs=rngs)
        self.key = nnx.Linear(d, d, rngs=rngs)
        self.value = nnx.Linear(d, d, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.attention_probs_dropout_prob, rngs=rngs)

    def transpose_for_scores(self, x):
        b, t, _ = x.shape
        return x.reshape(b, t, self.num_heads, self.head_size).transpose(0, 2, 1, 3)

    def __call__(self, hidden, extended_mask):
        q = self.transpose_for_scores(self.query(hidden))
        k = self.transpose_for_scores(self.key(hidden))
        v = self.transpose_for_scores(self.value(hidden))
        scores = q @ jnp.swapaxes(k, -1, -2) / math.sqrt(self.head_size) + extended_mask
        probs = self.dropout(jax.nn.softmax(scores, axis=-1))
        ctx = (probs @ v).transpose(0, 2, 1, 3)
        return ctx.reshape(ctx.shape[0], ctx.shape[1], -1)


class BertLayer(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        d, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.attention = BertSelfAttention(cfg, rngs=rngs)
        self.attention_output = nnx.Linear(d, d, rngs=rngs)
        self.attention_norm = nnx.LayerNorm(d, epsilon=eps, rngs=rngs)
        self.intermediate = nnx.Linear(d, cfg.intermediate_size, rngs=rngs)
        self.output = nnx.Linear(cfg.intermediate_size, d, rngs=rngs)
        self.output_norm = nnx.LayerNorm(d, epsilon=eps, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.hidden_dropout_prob, rngs=rngs)

    def __call__(self, hidden, extended_mask):
        attn = self.dropout(self.attention_output(self.attention(hidden, extended_mask)))
        hidden = self.attention_norm(attn + hidden)
        inter = nnx.gelu(self.intermediate(hidden), approximate=False)
        return self.output_norm(self.dropout(self.output(inter)) + hidden)


class BertForMaskedLM(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg, rngs=rngs)
        self.encoder = nnx.List([BertLayer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.transform = nnx.Linear(cfg.hidden_size, cfg.hidden_size, rngs=rngs)
        self.transform_norm = nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, rngs=rngs)
        self.decoder_bias = nnx.Param(jnp.zeros((cfg.vocab_size,)))
        self.log_var = nnx.Param(jnp.zeros(()))  # learnable loss weight

    def __call__(self, input_ids, token_type_ids, attention_mask):
        extended = (1.0 - attention_mask[:, None, None, :].astype(jnp.float32)) * -10000.0
        hidden = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder:
            hidden = layer(hidden, extended)
        h = self.transform_norm(nnx.gelu(self.transform(hidden), approximate=False))
        return self.embeddings.word_embeddings.attend(h) + self.decoder_bias[...]


def mlm_loss(logits, labels, label_weights):
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.sum(ce * label_weights) / jnp.maximum(jnp.sum(label_weights), 1.0)


def make(seed: int = 0, cfg: BertConfig | None = None) -> Case:
    cfg = cfg or BertConfig()
    b, t = 2, 12
    key = jax.random.key(seed + 1)
    labels = jax.random.randint(key, (b, t), 4, cfg.vocab_size)
    lengths = jnp.array([t, t - 3])
    attention_mask = (jnp.arange(t)[None] < lengths[:, None]).astype(jnp.int32)
    token_type_ids = (jnp.arange(t)[None] >= t // 2).astype(jnp.int32) * attention_mask
    masked = (jax.random.uniform(jax.random.fold_in(key, 1), (b, t)) < 0.3) & (attention_mask > 0)
    input_ids = jnp.where(masked, cfg.mask_token_id, labels)
    input_ids = jnp.where(attention_mask > 0, input_ids, cfg.pad_token_id)
    label_weights = masked.astype(jnp.float32)

    def loss_fn(model, input_ids, token_type_ids, attention_mask, labels, label_weights):
        logits = model(input_ids, token_type_ids, attention_mask)
        loss = mlm_loss(logits, labels, label_weights)
        return loss * jnp.exp(-model.log_var[...]) + model.log_var[...]

    def aux_loss_fn(model, input_ids, token_type_ids, attention_mask, labels, label_weights):
        logits = model(input_ids, token_type_ids, attention_mask)
        mlm = mlm_loss(logits, labels, label_weights)
        loss = mlm * jnp.exp(-model.log_var[...]) + model.log_var[...]
        hits = (jnp.argmax(logits, -1) == labels) * label_weights
        acc = jnp.sum(hits) / jnp.maximum(jnp.sum(label_weights), 1.0)
        return loss, {"loss": loss, "mlm_loss": mlm, "mlm_accuracy": acc}

    return Case(
        name="bert",
        factory=lambda: BertForMaskedLM(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(input_ids, token_type_ids, attention_mask, labels, label_weights),
        notes="word/position/token-type embeddings, post-LN layers, additive -10000 padding "
        "mask from an argument, attention dropout, exact GELU, MLM head tied to the word "
        "embeddings + bias, loss over masked positions, learnable loss weight (nnx.Param "
        "read in loss_fn after the model call)",
    )
