"""More feature models (test_feature_models.py runs them with its helpers): models with
several heads or inputs, written at stop 52 as a new user would:

- ``dann``: a domain-adversarial network: a label head and a domain head on shared
  features, the domain head behind a gradient-reversal layer (``jax.custom_vjp`` with a
  ``nondiff_argnums`` coefficient: the backward the planner runs is the user's rule);
- ``dict_heads``: named heads in an ``nnx.Dict``, reflect padding, a ``jax.lax.map``
  over the batch (a scan) of running means, ``jnp.diff``, a dict of outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from feature_models import _case, _key, _metrics
from flax import nnx
from zoo import Case


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def reverse_gradient(x, scale):
    return x


def _reverse_fwd(x, scale):
    return x, None


def _reverse_bwd(scale, _, g):
    return (-scale * g,)


reverse_gradient.defvjp(_reverse_fwd, _reverse_bwd)


class DANN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.features = nnx.Sequential(
            nnx.Linear(10, 24, rngs=rngs), nnx.relu, nnx.Linear(24, 24, rngs=rngs), nnx.relu
        )
        self.label = nnx.Linear(24, 3, rngs=rngs)
        self.domain = nnx.Sequential(
            nnx.Linear(24, 12, rngs=rngs), nnx.relu, nnx.Linear(12, 1, rngs=rngs)
        )

    def __call__(self, x):
        f = self.features(x)
        return self.label(f), self.domain(reverse_gradient(f, 0.3))


def dann_loss(model, x, y, domain):
    logits, d = model(x)
    labels = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return labels + optax.sigmoid_binary_cross_entropy(d[:, 0], domain).mean()


def dann() -> Case:
    x, y = jax.random.normal(_key(701), (16, 10)), jax.random.randint(_key(702), (16,), 0, 3)
    domain = (jnp.arange(16) % 2).astype(jnp.float32)
    factory = lambda: DANN(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("dann", factory, _metrics(dann_loss), (x, y, domain),
                 "gradient reversal by custom_vjp with nondiff_argnums")  # fmt: skip


class DictHeads(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(2, 6, (5,), padding="VALID", rngs=rngs)
        self.heads = nnx.Dict({"a": nnx.Linear(6, 2, rngs=rngs), "b": nnx.Linear(6, 3, rngs=rngs)})

    def __call__(self, x):
        x = jnp.pad(x, ((0, 0), (2, 2), (0, 0)), mode="reflect")
        h = jax.nn.silu(self.stem(x))
        steps = 1 + jnp.arange(h.shape[1])[:, None]
        h = jax.lax.map(lambda c: jnp.cumsum(c, 0) / steps, h)  # running means, per example
        h = jnp.diff(h, axis=1, prepend=0.0).mean(1)
        return {name: head(h) for name, head in self.heads.items()}


def dict_heads_loss(model, x):
    out = model(x)
    return jnp.mean(out["a"] ** 2) + jnp.mean(jnp.abs(out["b"]))


def dict_heads() -> Case:
    x = jax.random.normal(_key(705), (4, 12, 2))
    factory = lambda: DictHeads(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("dict_heads", factory, _metrics(dict_heads_loss), (x,),
                 "nnx.Dict heads, reflect padding, lax.map")  # fmt: skip


HEAD_CASES: dict[str, Callable[[], Case]] = {
    "dann": dann,
    "dict_heads": dict_heads,
}
