"""An EfficientNet-style classifier (Tan & Le, 2019) as Flax NNX ports write it: a stride-2
conv stem, MBConv blocks (1x1 expansion conv, depthwise conv with ``feature_group_count``,
squeeze-and-excitation with a global mean pool, two 1x1 convs and a sigmoid gate, 1x1
projection), swish (``jax.nn.silu``), ``nnx.BatchNorm`` in training mode
(``use_running_average=False``: batch statistics, running averages updated), drop-connect
and a residual when the shapes match, a 1x1 conv head, pooling, dropout and a linear
classifier. The block list is a list of tuples in the config."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class EfficientNetConfig:
    in_chans: int = 3
    stem_channels: int = 16
    # (expand_ratio, kernel, stride, in_channels, out_channels)
    blocks: list[tuple[int, int, int, int, int]] = field(
        default_factory=lambda: [(1, 3, 1, 16, 16), (4, 3, 2, 16, 24), (4, 5, 1, 24, 24)]
    )
    head_channels: int = 64
    se_ratio: float = 0.25
    drop_connect_rate: float = 0.1
    dropout_rate: float = 0.2
    num_classes: int = 10


def bn(features: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
    return nnx.BatchNorm(
        features, use_running_average=False, momentum=0.99, epsilon=1e-3, rngs=rngs
    )


class SqueezeExcite(nnx.Module):
    def __init__(self, channels: int, reduced: int, *, rngs: nnx.Rngs):
        self.reduce = nnx.Conv(channels, reduced, (1, 1), rngs=rngs)
        self.expand = nnx.Conv(reduced, channels, (1, 1), rngs=rngs)

    def __call__(self, x):
        s = jnp.mean(x, axis=(1, 2), keepdims=True)
        s = self.expand(jax.nn.silu(self.reduce(s)))
        return x * jax.nn.sigmoid(s)


class MBConv(nnx.Module):
    def __init__(self, cfg, expand, kernel, stride, cin, cout, *, rngs: nnx.Rngs):
        hidden = cin * expand
        self.expand_ratio = expand
        self.use_residual = stride == 1 and cin == cout
        if expand != 1:
            self.expand_conv = nnx.Conv(cin, hidden, (1, 1), use_bias=False, rngs=rngs)
            self.bn0 = bn(hidden, rngs)
        self.depthwise_conv = nnx.Conv(
            hidden,
            hidden,
            (kernel, kernel),
            strides=(stride, stride),
            feature_group_count=hidden,
            use_bias=False,
            rngs=rngs,
        )
        self.bn1 = bn(hidden, rngs)
        self.se = SqueezeExcite(hidden, max(1, int(cin * cfg.se_ratio)), rngs=rngs)
        self.project_conv = nnx.Conv(hidden, cout, (1, 1), use_bias=False, rngs=rngs)
        self.bn2 = bn(cout, rngs)
        self.drop_connect = nnx.Dropout(cfg.drop_connect_rate, broadcast_dims=(1, 2, 3), rngs=rngs)

    def __call__(self, inputs):
        x = inputs
        if self.expand_ratio != 1:
            x = jax.nn.silu(self.bn0(self.expand_conv(x)))
        x = jax.nn.silu(self.bn1(self.depthwise_conv(x)))
        x = self.se(x)
        x = self.bn2(self.project_conv(x))
        if self.use_residual:
            x = self.drop_connect(x) + inputs
        return x


class EfficientNet(nnx.Module):
    def __init__(self, cfg: EfficientNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.stem_conv = nnx.Conv(
            cfg.in_chans, cfg.stem_channels, (3, 3), strides=(2, 2), use_bias=False, rngs=rngs
        )
        self.stem_bn = bn(cfg.stem_channels, rngs)
        self.blocks = nnx.List([MBConv(cfg, *spec, rngs=rngs) for spec in cfg.blocks])
        last = cfg.blocks[-1][4]
        self.head_conv = nnx.Conv(last, cfg.head_channels, (1, 1), use_bias=False, rngs=rngs)
        self.head_bn = bn(cfg.head_channels, rngs)
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)
        self.classifier = nnx.Linear(cfg.head_channels, cfg.num_classes, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.silu(self.stem_bn(self.stem_conv(x)))
        for block in self.blocks:
            x = block(x)
        x = jax.nn.silu(self.head_bn(self.head_conv(x)))
        x = jnp.mean(x, axis=(1, 2))
        return self.classifier(self.dropout(x))


def make(seed: int = 0, cfg: EfficientNetConfig | None = None) -> Case:
    cfg = cfg or EfficientNetConfig()
    key = jax.random.key(seed + 1)
    images = jax.random.normal(key, (4, 16, 16, cfg.in_chans))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (4,), 0, cfg.num_classes)

    def loss_fn(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, images, labels):
        logits = model(images)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

    return Case(
        name="efficientnet",
        factory=lambda: EfficientNet(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(images, labels),
        notes="MBConv: 1x1 expansion, depthwise conv (3x3 and 5x5, stride 2), "
        "squeeze-and-excitation gate, swish, BatchNorm in training mode (batch stats "
        "updated), drop-connect residuals, conditional submodules, list-of-tuples config",
    )
