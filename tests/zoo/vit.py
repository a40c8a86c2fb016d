"""A Vision Transformer (ViT, Dosovitskiy et al.) classifier as the Flax NNX ViT examples
write it: patch embedding by a strided ``nnx.Conv``, a learned class token prepended with
``jnp.tile``, learned position embeddings (``nnx.Param``), pre-norm encoder blocks with
``nnx.MultiHeadAttention`` (attention dropout in training mode) and a GELU MLP with dropout,
classification head on the class token; label-smoothed cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class ViTConfig:
    image_size: int = 16
    patch_size: int = 4
    in_channels: int = 3
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_dim: int = 128
    num_classes: int = 10
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    label_smoothing: float = 0.1

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class MlpBlock(nnx.Module):
    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(cfg.hidden_size, cfg.mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(cfg.mlp_dim, cfg.hidden_size, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)

    def __call__(self, x):
        x = self.dropout(nnx.gelu(self.fc1(x)))
        return self.dropout(self.fc2(x))


class EncoderBlock(nnx.Module):
    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(cfg.hidden_size, epsilon=1e-6, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=cfg.num_heads,
            in_features=cfg.hidden_size,
            dropout_rate=cfg.attention_dropout_rate,
            deterministic=False,
            decode=False,
            rngs=rngs,
        )
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)
        self.norm2 = nnx.LayerNorm(cfg.hidden_size, epsilon=1e-6, rngs=rngs)
        self.mlp = MlpBlock(cfg, rngs=rngs)

    def __call__(self, x):
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nnx.Module):
    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        p = cfg.patch_size
        self.patch_embeddings = nnx.Conv(
            cfg.in_channels,
            cfg.hidden_size,
            kernel_size=(p, p),
            strides=(p, p),
            padding="VALID",
            rngs=rngs,
        )
        self.cls_token = nnx.Param(jnp.zeros((1, 1, cfg.hidden_size)))
        init = jax.nn.initializers.truncated_normal(stddev=0.02)
        self.position_embeddings = nnx.Param(
            init(rngs.params(), (1, cfg.num_patches + 1, cfg.hidden_size))
        )
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)
        self.encoder = nnx.List([EncoderBlock(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = nnx.LayerNorm(cfg.hidden_size, epsilon=1e-6, rngs=rngs)
        self.classifier = nnx.Linear(cfg.hidden_size, cfg.num_classes, rngs=rngs)

    def __call__(self, images):
        x = self.patch_embeddings(images)  # (b, h/p, w/p, d)
        b, h, w, d = x.shape
        x = x.reshape(b, h * w, d)
        cls = jnp.tile(self.cls_token[...], (b, 1, 1))
        x = jnp.concatenate([cls, x], axis=1) + self.position_embeddings[...]
        x = self.dropout(x)
        for block in self.encoder:
            x = block(x)
        x = self.final_norm(x)
        return self.classifier(x[:, 0])


def make(seed: int = 0, cfg: ViTConfig | None = None) -> Case:
    cfg = cfg or ViTConfig()
    key = jax.random.key(seed + 1)
    images = jax.random.normal(key, (4, cfg.image_size, cfg.image_size, cfg.in_channels))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (4,), 0, cfg.num_classes)

    def loss_fn(model, images, labels):
        logits = model(images)
        targets = optax.smooth_labels(jax.nn.one_hot(labels, cfg.num_classes), cfg.label_smoothing)
        return optax.softmax_cross_entropy(logits, targets).mean()

    def aux_loss_fn(model, images, labels):
        logits = model(images)
        targets = optax.smooth_labels(jax.nn.one_hot(labels, cfg.num_classes), cfg.label_smoothing)
        loss = optax.softmax_cross_entropy(logits, targets).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

    return Case(
        name="vit",
        factory=lambda: VisionTransformer(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(images, labels),
        notes="strided-conv patch embedding, class token via jnp.tile, learned position "
        "embeddings, pre-norm blocks with nnx.MultiHeadAttention (attention dropout), GELU "
        "MLP, dropout, label smoothing",
    )
