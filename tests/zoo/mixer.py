"""An MLP-Mixer classifier (Tolstikhin et al., 2021) as the Flax NNX ports write it: a
strided-conv patch stem, Mixer blocks (LayerNorm, a token-mixing MLP applied across patches
after ``jnp.swapaxes``, LayerNorm, a channel-mixing MLP, both GELU with residuals), a final
LayerNorm, global average pooling over patches and a zero-initialised linear head."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class MixerConfig:
    image_size: int = 16
    patch_size: int = 4
    in_channels: int = 3
    hidden_dim: int = 32
    tokens_mlp_dim: int = 32
    channels_mlp_dim: int = 64
    num_blocks: int = 2
    num_classes: int = 10


class MlpBlock(nnx.Module):
    def __init__(self, dim: int, mlp_dim: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(dim, mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, dim, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.gelu(self.fc1(x)))


class MixerBlock(nnx.Module):
    def __init__(self, cfg: MixerConfig, num_patches: int, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(cfg.hidden_dim, rngs=rngs)
        self.token_mixing = MlpBlock(num_patches, cfg.tokens_mlp_dim, rngs=rngs)
        self.norm2 = nnx.LayerNorm(cfg.hidden_dim, rngs=rngs)
        self.channel_mixing = MlpBlock(cfg.hidden_dim, cfg.channels_mlp_dim, rngs=rngs)

    def __call__(self, x):
        y = jnp.swapaxes(self.norm1(x), 1, 2)
        x = x + jnp.swapaxes(self.token_mixing(y), 1, 2)
        return x + self.channel_mixing(self.norm2(x))


class MlpMixer(nnx.Module):
    def __init__(self, cfg: MixerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        p = cfg.patch_size
        num_patches = (cfg.image_size // p) ** 2
        self.stem = nnx.Conv(cfg.in_channels, cfg.hidden_dim, (p, p), strides=(p, p), rngs=rngs)
        self.blocks = nnx.List(
            [MixerBlock(cfg, num_patches, rngs=rngs) for _ in range(cfg.num_blocks)]
        )
        self.pre_head_layer_norm = nnx.LayerNorm(cfg.hidden_dim, rngs=rngs)
        self.head = nnx.Linear(
            cfg.hidden_dim, cfg.num_classes, kernel_init=nnx.initializers.zeros, rngs=rngs
        )

    def __call__(self, images):
        x = self.stem(images)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        for block in self.blocks:
            x = block(x)
        x = jnp.mean(self.pre_head_layer_norm(x), axis=1)
        return self.head(x)


def make(seed: int = 0, cfg: MixerConfig | None = None) -> Case:
    cfg = cfg or MixerConfig()
    key = jax.random.key(seed + 1)
    images = jax.random.normal(key, (4, cfg.image_size, cfg.image_size, cfg.in_channels))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (4,), 0, cfg.num_classes)

    def loss_fn(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, images, labels):
        logits = model(images)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

    return Case(
        name="mixer",
        factory=lambda: MlpMixer(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(images, labels),
        notes="patch stem, token-mixing MLP across patches via swapaxes, channel-mixing "
        "MLP, pre-LayerNorm residuals, mean pool, zero-initialised head",
    )
