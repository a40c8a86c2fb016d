"""More feature models (besides tests/feature_models.py's; test_feature_models.py runs
both, with its helpers), on sequences and loops, written at stop 50 as a new user would:

- ``wavenet``: dilated causal convolutions (``padding="CAUSAL"``), gated activations,
  grouped 1x1 convolutions, skip sums;
- ``ctc``: ``optax.ctc_loss`` (a scan over time inside the loss) with padded frames
  and labels;
- ``scan_dropout``: an ``nnx.scan`` over a stack made by ``nnx.vmap`` with
  ``nnx.split_rngs``, dropout inside each layer (a key per layer);
- ``fixed_point``: a DEQ-style fixed point solved by ``lax.while_loop`` with no
  gradient (its results reach the loss through ``stop_gradient`` only), then one
  differentiable step (refused before stop 50: "JAX cannot differentiate it").
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from feature_models import _case, _key, _metrics
from flax import nnx
from zoo import Case


def mse(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


class WaveNet(nnx.Module):
    def __init__(self, c: int = 8, *, rngs: nnx.Rngs):
        self.inp = nnx.Conv(1, c, (1,), rngs=rngs)
        self.dilated = nnx.List(
            [nnx.Conv(c, 2 * c, (2,), kernel_dilation=(d,), padding="CAUSAL", rngs=rngs)
             for d in (1, 2, 4)]
        )  # fmt: skip
        self.mix = nnx.List(
            [nnx.Conv(c, c, (1,), feature_group_count=2, rngs=rngs) for _ in range(3)]
        )
        self.out = nnx.Conv(c, 4, (1,), rngs=rngs)

    def __call__(self, x):  # (batch, time, 1)
        h, skip = self.inp(x), 0.0
        for dilated, mix in zip(self.dilated, self.mix, strict=True):
            a, b = jnp.split(dilated(h), 2, -1)
            z = jnp.tanh(a) * jax.nn.sigmoid(b)
            skip = skip + z
            h = h + mix(z)
        return self.out(jax.nn.relu(skip))


def wavenet() -> Case:
    x = jax.random.normal(_key(501), (2, 16, 1))
    y = jax.random.randint(_key(502), (2, 16), 0, 4)

    def loss_fn(model, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    factory = lambda: WaveNet(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("wavenet", factory, _metrics(loss_fn), (x, y), "dilated causal convolutions")


class Frames(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a, self.b = nnx.Linear(6, 16, rngs=rngs), nnx.Linear(16, 5, rngs=rngs)

    def __call__(self, x):
        return self.b(jax.nn.gelu(self.a(x)))


def ctc() -> Case:
    x = jax.random.normal(_key(503), (2, 10, 6))
    frame_pad = jnp.zeros((2, 10)).at[0, 8:].set(1.0)
    labels = jnp.array([[1, 2, 3, 0], [2, 2, 4, 1]])
    label_pad = jnp.array([[0, 0, 0, 1], [0, 0, 0, 0]], jnp.float32)

    def loss_fn(model, x, frame_pad, labels, label_pad):
        return optax.ctc_loss(model(x), frame_pad, labels, label_pad).mean()

    factory = lambda: Frames(rngs=nnx.Rngs(0))  # noqa: E731
    return _case(
        "ctc", factory, _metrics(loss_fn), (x, frame_pad, labels, label_pad), "optax.ctc_loss"
    )


class DropoutLayer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(16, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)

    def __call__(self, x):
        return x + self.drop(jax.nn.gelu(self.linear(x)))


class ScannedDropout(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return DropoutLayer(rngs)

        self.layers = make(rngs)
        self.head = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def step(x, layer):
            return layer(x)

        return self.head(step(x, self.layers))


def scan_dropout() -> Case:
    x, y = jax.random.normal(_key(504), (6, 16)), jax.random.normal(_key(505), (6, 2))
    factory = lambda: ScannedDropout(rngs=nnx.Rngs(0, dropout=1))  # noqa: E731
    return _case("scan_dropout", factory, _metrics(mse), (x, y), "nnx.scan stack with dropout")


class FixedPoint(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(5, 8, rngs=rngs)
        self.w = nnx.Linear(8, 8, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        u = self.inp(x)
        f = lambda z: jnp.tanh(0.5 * self.w(z) + u)  # noqa: E731

        def unsettled(carry):
            z, i = carry
            return (i < 30) & (jnp.max(jnp.abs(f(z) - z)) > 1e-5)

        z, _ = jax.lax.while_loop(unsettled, lambda c: (f(c[0]), c[1] + 1), (0.0 * u, 0))
        return self.out(f(jax.lax.stop_gradient(z)))


def fixed_point() -> Case:
    x, y = jax.random.normal(_key(506), (6, 5)), jax.random.normal(_key(507), (6, 2))
    factory = lambda: FixedPoint(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("fixed_point", factory, _metrics(mse), (x, y), "while_loop without gradient")


LOOP_CASES: dict[str, Callable[[], Case]] = {
    "wavenet": wavenet,
    "ctc": ctc,
    "scan_dropout": scan_dropout,
    "fixed_point": fixed_point,
}
