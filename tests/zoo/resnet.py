"""A ResNet with basic blocks (He et al., 2016; ResNet-18 style) as the Flax NNX examples
write it: a conv stem with ``nnx.BatchNorm`` in training mode and ``nnx.max_pool``, stages of
basic blocks (two 3x3 convs with BatchNorm and ReLU), a strided first block per stage with a
1x1 projection shortcut (conv + BatchNorm), global average pooling with ``nnx.avg_pool``, a
linear head; the loss adds L2 weight decay over the conv kernels (``nnx.state`` filtered by
``nnx.Param``), as the classic training scripts do."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class ResNetConfig:
    in_channels: int = 3
    stem_width: int = 16
    stage_sizes: list[int] = field(default_factory=lambda: [1, 1])
    widths: list[int] = field(default_factory=lambda: [16, 32])
    num_classes: int = 10
    weight_decay: float = 1e-4


class BasicBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs):
        s = (stride, stride)
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=s, padding=1, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(cout, use_running_average=False, momentum=0.9, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), padding=1, use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(
            cout,
            use_running_average=False,
            momentum=0.9,
            scale_init=nnx.initializers.zeros,
            rngs=rngs,
        )
        if stride != 1 or cin != cout:
            self.proj_conv = nnx.Conv(cin, cout, (1, 1), strides=s, use_bias=False, rngs=rngs)
            self.proj_bn = nnx.BatchNorm(cout, use_running_average=False, rngs=rngs)
        else:
            self.proj_conv = None
            self.proj_bn = None

    def __call__(self, x):
        residual = x
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.proj_conv is not None:
            residual = self.proj_bn(self.proj_conv(residual))
        return nnx.relu(residual + y)


class ResNet(nnx.Module):
    def __init__(self, cfg: ResNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.conv_init = nnx.Conv(
            cfg.in_channels, cfg.stem_width, (3, 3), padding=1, use_bias=False, rngs=rngs
        )
        self.bn_init = nnx.BatchNorm(cfg.stem_width, use_running_average=False, rngs=rngs)
        blocks, cin = [], cfg.stem_width
        for i, (n, width) in enumerate(zip(cfg.stage_sizes, cfg.widths, strict=True)):
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(cin, width, stride, rngs=rngs))
                cin = width
        self.blocks = nnx.List(blocks)
        self.fc = nnx.Linear(cin, cfg.num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn_init(self.conv_init(x)))
        x = nnx.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
        for block in self.blocks:
            x = block(x)
        x = nnx.avg_pool(x, window_shape=x.shape[1:3])  # global average pool
        return self.fc(x.reshape(x.shape[0], -1))


def l2_penalty(model: nnx.Module):
    params = nnx.state(model, nnx.Param)
    kernels = [p for path, p in nnx.to_flat_state(params) if path[-1] == "kernel"]
    return sum(jnp.sum(jnp.square(k[...])) for k in kernels)


def make(seed: int = 0, cfg: ResNetConfig | None = None) -> Case:
    cfg = cfg or ResNetConfig()
    key = jax.random.key(seed + 1)
    images = jax.random.normal(key, (4, 16, 16, cfg.in_channels))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (4,), 0, cfg.num_classes)

    def loss_fn(model, images, labels):
        logits = model(images)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return ce + 0.5 * cfg.weight_decay * l2_penalty(model)

    def aux_loss_fn(model, images, labels):
        logits = model(images)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        loss = ce + 0.5 * cfg.weight_decay * l2_penalty(model)
        acc = jnp.mean(jnp.argmax(logits, -1) == labels)
        return loss, {"loss": loss, "cross_entropy": ce, "accuracy": acc}

    return Case(
        name="resnet",
        factory=lambda: ResNet(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(images, labels),
        notes="basic blocks, BatchNorm in training mode (zero-init last scale), strided "
        "block with 1x1 projection shortcut, None submodule attributes, nnx.max_pool stem, "
        "nnx.avg_pool global pool, L2 weight decay over nnx.state(model, nnx.Param) in loss",
    )
