"""A ConvNeXt classifier (Liu et al., 2022) as Flax NNX ports write it: a patchify stem
(strided conv + LayerNorm), stages of ConvNeXt blocks (depthwise 7x7 conv with
``feature_group_count``, LayerNorm over channels, inverted-bottleneck MLP with ``nnx.Linear``
4x and GELU, a layer-scale parameter ``gamma = nnx.Param(jnp.full((dim,), 1e-6))``,
stochastic depth as per-sample ``nnx.Dropout`` with ``broadcast_dims``, rates from a plain
list held by the model), downsampling layers (LayerNorm + 2x2 stride-2 conv), global
average pooling, LayerNorm and a linear head."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class ConvNeXtConfig:
    in_chans: int = 3
    num_classes: int = 10
    depths: list[int] = field(default_factory=lambda: [2, 1])
    dims: list[int] = field(default_factory=lambda: [16, 32])
    drop_path_rate: float = 0.1
    layer_scale_init_value: float = 1e-6


class DropPath(nnx.Module):
    """Stochastic depth: drops a whole residual branch per sample."""

    def __init__(self, rate: float, *, rngs: nnx.Rngs):
        self.dropout = nnx.Dropout(rate, broadcast_dims=(1, 2, 3), rngs=rngs)

    def __call__(self, x):
        return self.dropout(x)


class Block(nnx.Module):
    def __init__(self, dim: int, drop_path: float, layer_scale: float, *, rngs: nnx.Rngs):
        self.dwconv = nnx.Conv(dim, dim, (7, 7), padding=3, feature_group_count=dim, rngs=rngs)
        self.norm = nnx.LayerNorm(dim, epsilon=1e-6, rngs=rngs)
        self.pwconv1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.pwconv2 = nnx.Linear(4 * dim, dim, rngs=rngs)
        self.gamma = nnx.Param(jnp.full((dim,), layer_scale))
        self.drop_path = DropPath(drop_path, rngs=rngs)

    def __call__(self, x):
        shortcut = x
        x = self.dwconv(x)
        x = self.norm(x)
        x = self.pwconv2(nnx.gelu(self.pwconv1(x)))
        x = self.gamma[...] * x
        return shortcut + self.drop_path(x)


class Downsample(nnx.Module):
    def __init__(self, in_dim: int, out_dim: int, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(in_dim, epsilon=1e-6, rngs=rngs)
        self.conv = nnx.Conv(in_dim, out_dim, (2, 2), strides=(2, 2), rngs=rngs)

    def __call__(self, x):
        return self.conv(self.norm(x))


class ConvNeXt(nnx.Module):
    def __init__(self, cfg: ConvNeXtConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dims = cfg.dims
        total = sum(cfg.depths)
        self.drop_rates = [cfg.drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        self.stem_conv = nnx.Conv(cfg.in_chans, dims[0], (2, 2), strides=(2, 2), rngs=rngs)
        self.stem_norm = nnx.LayerNorm(dims[0], epsilon=1e-6, rngs=rngs)
        downsample, stages, k = [], [], 0
        for i, (depth, dim) in enumerate(zip(cfg.depths, dims, strict=True)):
            if i > 0:
                downsample.append(Downsample(dims[i - 1], dim, rngs=rngs))
            blocks = []
            for _ in range(depth):
                rate = self.drop_rates[k]
                blocks.append(Block(dim, rate, cfg.layer_scale_init_value, rngs=rngs))
                k += 1
            stages.append(nnx.List(blocks))
        self.downsample_layers = nnx.List(downsample)
        self.stages = nnx.List(stages)
        self.norm = nnx.LayerNorm(dims[-1], epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(dims[-1], cfg.num_classes, rngs=rngs)

    def __call__(self, x):
        x = self.stem_norm(self.stem_conv(x))
        for i, stage in enumerate(self.stages):
            if i > 0:
                x = self.downsample_layers[i - 1](x)
            for block in stage:
                x = block(x)
        x = self.norm(jnp.mean(x, axis=(1, 2)))
        return self.head(x)


def make(seed: int = 0, cfg: ConvNeXtConfig | None = None) -> Case:
    cfg = cfg or ConvNeXtConfig()
    key = jax.random.key(seed + 1)
    images = jax.random.normal(key, (2, 16, 16, cfg.in_chans))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (2,), 0, cfg.num_classes)

    def loss_fn(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, images, labels):
        logits = model(images)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        top1 = jnp.mean(jnp.argmax(logits, -1) == labels)
        return loss, {"loss": loss, "top1": top1}

    return Case(
        name="convnext",
        factory=lambda: ConvNeXt(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(images, labels),
        notes="depthwise 7x7 conv (feature_group_count), channel LayerNorm, 4x Linear "
        "bottleneck with GELU, layer scale 1e-6, per-sample stochastic depth (Dropout "
        "broadcast_dims), nested nnx.List stages, list config fields and a plain list "
        "attribute, downsampling convs, global mean pool",
    )
