"""A third seeded generator of random Flax NNX models: image models, whose operations
reach what the chain (tests/random_models.py) and sequence (tests/random_sequence_models.py)
generators do not: two-dimensional convolutions and windows.

``random_image_case(seed)`` draws 2-6 layers over a ``(batch, height, width, channels)``
activation, each a short pattern from :data:`LAYERS`: a 3x3 convolution (``SAME``,
``CIRCULAR`` padding, dilated, depthwise), a 1x1 convolution, a strided convolution and a
``ConvTranspose`` back up, an average pool by two and ``jax.image.resize`` back up
(nearest or bilinear), pixel shuffle (a convolution to four times the channels, then
depth to space by ``reshape`` / ``transpose``), max and average pooling over 3x3 windows
at stride one, squeeze-and-excitation (a global mean, two ``Linear`` layers, a sigmoid
gate), attention over the pixels (``jax.nn.dot_product_attention``), a shifted window
(``jnp.roll`` of both spatial axes), GroupNorm, BatchNorm in training mode, LayerNorm
over the channels, dropout of single values, of whole channels (``broadcast_dims``) and
of whole examples (stochastic depth on a residual branch); with residual adds and
channel concatenations (then a 1x1 convolution) of earlier activations between them.
The loss is a cross-entropy of a pooled classifier, a per-pixel mean squared error of a
1x1 convolution head (dense prediction), or the first with a learnable loss weight read
by ``loss_fn`` after the model call.

Values a ``max_pool`` compares are those of a convolution (continuous: no ties, as in
the sequence generator). A case is a :class:`random_models.RandomCase`
(``loss_fn(model, x, labels, target)``), so test_random_models.check runs it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from random_models import ACTS, RandomCase, drawn_case, earlier

CHANNELS, SIZE, BATCH = 4, 8, 2

LAYERS = (
    ("conv", "act"),
    ("conv1x1", "act"),
    ("down_up",),
    ("resize",),
    ("shuffle",),
    ("conv", "maxpool"),
    ("avgpool", "conv1x1"),
    ("se",),
    ("attention",),
    ("roll", "conv"),
    ("groupnorm", "act", "conv"),
    ("batchnorm", "act", "conv"),
    ("layernorm", "conv1x1"),
    ("dropout", "conv"),
    ("drop_channels", "conv1x1"),
    ("drop_path",),
)


def _conv(arg, c: int, rngs: nnx.Rngs) -> nnx.Conv:
    if arg == "circular":
        return nnx.Conv(c, c, (3, 3), padding="CIRCULAR", rngs=rngs)
    if arg == "dilated":
        return nnx.Conv(c, c, (3, 3), kernel_dilation=2, rngs=rngs)
    if arg == "depthwise":
        return nnx.Conv(c, c, (3, 3), feature_group_count=c, rngs=rngs)
    return nnx.Conv(c, c, (3, 3), rngs=rngs)


def _layer(kind: str, arg, c: int, rngs: nnx.Rngs):
    if kind == "conv":
        return _conv(arg, c, rngs)
    if kind == "conv1x1":
        return nnx.Conv(c, c, (1, 1), rngs=rngs)
    if kind == "down_up":
        return nnx.Dict(
            down=nnx.Conv(c, 2 * c, (3, 3), strides=2, rngs=rngs),
            up=nnx.ConvTranspose(2 * c, c, (2, 2), strides=2, rngs=rngs),
        )
    if kind == "resize":
        return nnx.Conv(c, c, (3, 3), rngs=rngs)
    if kind == "shuffle":
        return nnx.Conv(c, 4 * c, (3, 3), rngs=rngs)
    if kind == "se":
        return nnx.Dict(a=nnx.Linear(c, 2, rngs=rngs), b=nnx.Linear(2, c, rngs=rngs))
    if kind == "attention":
        return nnx.Dict(qkv=nnx.Linear(c, 3 * c, rngs=rngs), out=nnx.Linear(c, c, rngs=rngs))
    if kind == "groupnorm":
        return nnx.GroupNorm(c, num_groups=2, rngs=rngs)
    if kind == "batchnorm":
        return nnx.BatchNorm(c, use_running_average=False, rngs=rngs)
    if kind == "layernorm":
        return nnx.LayerNorm(c, rngs=rngs)
    if kind == "dropout":
        return nnx.Dropout(arg, rngs=rngs)
    if kind == "drop_channels":
        return nnx.Dropout(arg, broadcast_dims=(1, 2), rngs=rngs)
    if kind == "drop_path":
        return nnx.Dict(
            conv=nnx.Conv(c, c, (3, 3), rngs=rngs),
            drop=nnx.Dropout(arg, broadcast_dims=(1, 2, 3), rngs=rngs),
        )
    if kind == "concat":
        return nnx.Conv(2 * c, c, (1, 1), rngs=rngs)
    return None


class ImageModel(nnx.Module):
    def __init__(self, ops: tuple, *, rngs: nnx.Rngs):
        self.ops = list(ops)  # held as a (list) attribute, as configs are
        self.stem = nnx.Conv(3, CHANNELS, (3, 3), rngs=rngs)
        self.layers = nnx.List([_layer(kind, arg, CHANNELS, rngs) for kind, arg in ops])
        self.classifier = nnx.Linear(CHANNELS, 3, rngs=rngs)
        self.dense = nnx.Conv(CHANNELS, 2, (1, 1), rngs=rngs)
        self.loss_weight = nnx.Param(jnp.array(0.5))

    def __call__(self, x):
        x = self.stem(x)
        seen = [x]
        for (kind, arg), layer in zip(self.ops, self.layers, strict=True):
            x = _apply(kind, arg, layer, x, seen)
            seen.append(x)
        return self.classifier(x.mean((1, 2))), self.dense(x)


def _apply(kind, arg, layer, x, seen):
    if kind in ("conv", "conv1x1", "groupnorm", "batchnorm", "layernorm", "dropout",
                "drop_channels"):  # fmt: skip
        return layer(x)
    if kind == "act":
        return getattr(jax.nn, arg)(x)
    if kind == "residual":
        return x + earlier(seen, x, arg)
    if kind == "concat":
        return layer(jnp.concatenate([x, earlier(seen, x, arg)], -1))
    if kind == "down_up":
        return x + layer["up"](jax.nn.relu(layer["down"](x)))
    if kind == "resize":
        small = nnx.avg_pool(layer(x), (2, 2), strides=(2, 2))
        return jax.image.resize(small, x.shape, method=arg)
    if kind == "shuffle":  # pixel shuffle of a half-size map back to the full size
        b, h, w, c = x.shape
        y = layer(nnx.avg_pool(x, (2, 2), strides=(2, 2)))
        y = y.reshape(b, h // 2, w // 2, 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
        return y.reshape(b, h, w, c)
    if kind == "maxpool":
        return nnx.max_pool(x, (3, 3), strides=(1, 1), padding="SAME")
    if kind == "avgpool":
        return nnx.avg_pool(x, (3, 3), strides=(1, 1), padding="SAME")
    if kind == "se":
        gate = jax.nn.sigmoid(layer["b"](jax.nn.relu(layer["a"](x.mean((1, 2))))))
        return x * gate[:, None, None, :]
    if kind == "attention":
        b, h, w, c = x.shape
        tokens = x.reshape(b, h * w, c)
        q, k, v = (t.reshape(b, h * w, 1, c) for t in jnp.split(layer["qkv"](tokens), 3, -1))
        out = jax.nn.dot_product_attention(q, k, v).reshape(b, h * w, c)
        return x + layer["out"](out).reshape(b, h, w, c)
    if kind == "roll":
        return jnp.roll(x, (1, -1), axis=(1, 2))
    if kind == "drop_path":  # stochastic depth: the branch dropped per example
        return x + layer["drop"](jax.nn.gelu(layer["conv"](x)))
    raise ValueError(kind)


def draw_ops(rng: np.random.Generator) -> tuple:
    """2-6 layers of :data:`LAYERS` with their arguments (activations, dropout rates,
    convolution paddings, resize methods), with residual adds and concatenations
    between them."""
    ops: list = []
    for _ in range(int(rng.integers(2, 7))):
        for kind in LAYERS[int(rng.integers(len(LAYERS)))]:
            arg = None
            if kind == "act":
                arg = ACTS[int(rng.integers(len(ACTS)))]
            elif kind in ("dropout", "drop_channels", "drop_path"):
                arg = float(rng.choice([0.0, 0.1, 0.5]))
            elif kind == "conv":
                arg = ("same", "circular", "dilated", "depthwise")[int(rng.integers(4))]
            elif kind == "resize":
                arg = ("nearest", "bilinear")[int(rng.integers(2))]
            ops.append((kind, arg))
        draw = rng.random()
        if draw < 0.3:
            ops.append(("residual", int(rng.integers(4))))
        elif draw < 0.45:
            ops.append(("concat", int(rng.integers(4))))
    return tuple(ops)


def random_image_case(seed: int) -> RandomCase:
    rng = np.random.default_rng(seed)
    ops = draw_ops(rng)
    loss_kind = ("xent", "dense", "weighted")[int(rng.integers(3))]
    x = jnp.asarray(rng.standard_normal((BATCH, SIZE, SIZE, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 3, (BATCH,)), jnp.int32)
    target = jnp.asarray(rng.standard_normal((BATCH, SIZE, SIZE, 2)), jnp.float32)

    def loss_fn(model, x, labels, target):
        logits, dense = model(x)
        if loss_kind == "dense":
            return jnp.mean((dense - target) ** 2)
        logp = jax.nn.log_softmax(logits)
        xent = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))
        if loss_kind == "xent":
            return xent
        return xent * model.loss_weight[...] + 0.1 * jnp.mean(dense**2)

    def factory():
        return ImageModel(ops, rngs=nnx.Rngs(seed, dropout=seed + 1))

    return drawn_case(seed, ops, factory, loss_fn, (x, labels, target), rng)
