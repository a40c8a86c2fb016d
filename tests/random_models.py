"""A seeded generator of random Flax NNX models for the automatic planner's tests.

``random_case(seed)`` draws a chain of 3-15 operations over a ``(batch, width)``
activation: 1-5 layers, each a short pattern ending in a Linear layer (a Linear; an MLP
with a random activation; LayerNorm, RMSNorm or BatchNorm in training mode before a
Linear; dropout of a random rate; a small softmax attention; a learnable scale; a max
reduction; an integer mask), with residual adds and concatenations of earlier
activations drawn between them (skips across several blocks). The loss is a mean squared
error, a cross-entropy against integer labels, or a weighted sum with a learnable loss
weight read by the loss function after the model call. The learnable scales and the
loss are multiplied by a warm-up factor made from a Python int argument,
``jnp.minimum(1.0, (step + 1) / 4)``: a weakly typed scalar that the cuts carry to later
blocks and to the loss stage (``step`` = 7 makes it exactly 1.0: the values are those
without it). Layers are drawn from a fixed menu at one width, so that blocks recur from
model to model as they do in real models and hundreds of models plan in a test (kernels
are shared by what they compute).

Each case is a ``RandomCase``: ``factory()`` builds the same model every call,
``loss_fn(model, x, mask, labels, target, step)``, ``aux_loss_fn`` returning ``(loss,
{"loss": loss, ...})``, ``args``, ``ops`` (the drawn operations, for messages) and ``fraction``, a
random number in [0, 1) for the test to draw a budget from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ACTS = ("gelu", "relu", "tanh", "silu")
WIDTH, BATCH = 8, 4
STEP = 7  # the Python int argument: warm-up factor min(1, (7 + 1) / 4) = 1.0


def earlier(seen: list, x, arg: int):
    """The activation a skip connection reads: the ``arg``-th (modulo their number) of
    the activations before the last in ``seen`` with ``x``'s shape, else ``x`` itself."""
    same = [s for s in seen[:-1] if s.shape == x.shape] or [x]
    return same[arg % len(same)]


def warm_up(step):
    """The warm-up factor of a Python int ``step``: weakly typed, as users make it."""
    return jnp.minimum(1.0, (step + 1) / 4)


@dataclass(frozen=True)
class RandomCase:
    seed: int
    ops: tuple
    factory: Callable
    loss_fn: Callable
    aux_loss_fn: Callable
    args: tuple
    fraction: float


def drawn_case(seed: int, ops: tuple, factory: Callable, loss_fn: Callable, args: tuple,
               rng: np.random.Generator) -> RandomCase:  # fmt: skip
    """The :class:`RandomCase` of a drawn model: ``aux_loss_fn`` returns the loss with
    metrics that hold it, and ``fraction`` is the generator's last draw."""

    def aux_loss_fn(model, *args):
        loss = loss_fn(model, *args)
        return loss, {"loss": loss, "scaled": 2 * loss}

    return RandomCase(seed, ops, factory, loss_fn, aux_loss_fn, args, float(rng.random()))


class RandomModel(nnx.Module):
    def __init__(self, ops: tuple, width: int, *, rngs: nnx.Rngs):
        self.ops = list(ops)  # the drawn operations, held as a (list) attribute
        layers = []
        w = width
        for kind, arg in ops:
            if kind == "linear":
                layers.append(nnx.Linear(w, w, rngs=rngs))
            elif kind == "linear2":
                layers.append(nnx.Linear(w, 2 * w, rngs=rngs))
            elif kind == "linear_back":
                layers.append(nnx.Linear(2 * w, w, rngs=rngs))
            elif kind == "layernorm":
                layers.append(nnx.LayerNorm(w, rngs=rngs))
            elif kind == "rmsnorm":
                layers.append(nnx.RMSNorm(w, rngs=rngs))
            elif kind == "batchnorm":
                layers.append(nnx.BatchNorm(w, use_running_average=False, rngs=rngs))
            elif kind == "dropout":
                layers.append(nnx.Dropout(arg, rngs=rngs))
            elif kind == "concat":
                layers.append(nnx.Linear(2 * w, w, rngs=rngs))
            elif kind == "scale":
                layers.append(nnx.Param(jnp.full((w,), 1.5)))
            elif kind == "attention":
                layers.append(nnx.Linear(w, 2 * w, use_bias=False, rngs=rngs))
            else:
                layers.append(None)
        self.layers = nnx.List(layers)
        self.head = nnx.Linear(w, 3, rngs=rngs)
        self.loss_weight = nnx.Param(jnp.array(0.5))  # weakly typed, as users write it

    def __call__(self, x, mask, step):
        warm = warm_up(step)
        seen = [x]
        for (kind, arg), layer in zip(self.ops, self.layers, strict=True):
            if kind in ("linear", "linear2", "linear_back", "layernorm", "rmsnorm",
                        "batchnorm", "dropout"):  # fmt: skip
                x = layer(x)
            elif kind == "act":
                x = getattr(jax.nn, arg)(x)
            elif kind in ("residual", "concat"):
                skip = earlier(seen, x, arg)
                x = x + skip if kind == "residual" else layer(jnp.concatenate([x, skip], -1))
            elif kind == "scale":
                x = x * layer[...] * warm
            elif kind == "attention":
                q, k = jnp.split(layer(x), 2, axis=-1)
                weights = jax.nn.softmax(q @ k.T / np.sqrt(x.shape[-1]), axis=-1)
                x = weights @ x
            elif kind == "max":  # of continuous values: no ties (see the test)
                x = x - jnp.max(x, axis=-1, keepdims=True)
            elif kind == "mask":
                x = jnp.where(mask[:, None] > 0, x, 0.0)
            seen.append(x)
        return self.head(x)


LAYERS = (
    (("linear", None),),
    (("linear2", None), ("act", None), ("linear_back", None)),
    (("layernorm", None), ("linear", None)),
    (("rmsnorm", None), ("act", None), ("linear", None)),
    (("batchnorm", None), ("act", None), ("linear", None)),
    (("dropout", None), ("linear", None)),
    (("attention", None), ("linear", None)),
    (("scale", None), ("linear", None)),
    (("max", None), ("linear", None)),
    (("mask", None), ("linear", None)),
)


def draw_ops(rng: np.random.Generator) -> tuple:
    """1-5 layers of :data:`LAYERS` (random activations and dropout rates), with
    residual adds and concatenations of earlier activations between them."""
    ops: list = []
    for _ in range(int(rng.integers(1, 6))):
        layer = []
        for kind, _ in LAYERS[int(rng.integers(len(LAYERS)))]:
            arg = None
            if kind == "act":
                arg = ACTS[int(rng.integers(len(ACTS)))]
            elif kind == "dropout":
                arg = float(rng.choice([0.1, 0.5]))
            layer.append((kind, arg))
        if rng.random() < 0.4:
            layer.append((("residual", "concat")[int(rng.integers(2))], int(rng.integers(4))))
        if len(ops) + len(layer) > 15:  # whole layers only: a cut one may end wider
            break
        ops += layer
    while len(ops) < 3:
        ops.append(("linear", None))
    return tuple(ops)


def random_case(seed: int) -> RandomCase:
    rng = np.random.default_rng(seed)
    width, batch = WIDTH, BATCH
    ops = draw_ops(rng)
    loss_kind = ("mse", "xent", "weighted")[int(rng.integers(3))]
    x = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)
    mask = jnp.asarray(rng.integers(0, 2, (batch,)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, 3, (batch,)), jnp.int32)
    target = jnp.asarray(rng.standard_normal((batch, 3)), jnp.float32)

    def loss_fn(model, x, mask, labels, target, step):
        warm = warm_up(step)  # read by the loss stage: the cuts carry it
        out = model(x, mask, step)
        if loss_kind == "mse":
            return jnp.mean((out - target) ** 2) * warm
        logp = jax.nn.log_softmax(out)
        xent = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))
        if loss_kind == "xent":
            return xent * warm
        return (xent * model.loss_weight[...] + jnp.mean(out**2)) * warm

    def factory():
        return RandomModel(ops, width, rngs=nnx.Rngs(seed))

    return drawn_case(seed, ops, factory, loss_fn, (x, mask, labels, target, STEP), rng)
