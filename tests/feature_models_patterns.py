"""More feature models (test_feature_models.py runs them with its helpers): patterns of
published models not probed before stop 53, written as a new user would:

- ``forces``: an interatomic potential trained on forces, ``-jax.grad`` of the model's
  energy in the positions inside the forward (a second derivative in the step);
- ``sinkhorn``: an entropic optimal-transport loss, log-domain Sinkhorn iterations by
  ``lax.fori_loop`` (a fixed trip count: a scan) in ``loss_fn``;
- ``xl``: Transformer-XL memory, each layer's previous segment in an ``nnx.Cache`` read
  through ``stop_gradient`` and written by the call, ``nnx.List`` layers, tied
  ``Embed.attend`` output;
- ``router``: ``lax.top_k`` token selection by ``take_along_axis`` and ``lax.cond`` on a
  value of the batch;
- ``fpn``: a feature pyramid, ``jax.image.resize`` bilinear upsampling, ``GroupNorm``,
  a focal loss;
- ``pointnet``: an input transform applied by ``einsum`` per example, max pooling over
  points, BatchNorm and dropout in training, smoothed labels;
- ``sequential``: ``nnx.Sequential`` holding plain functions, an ``nnx.List`` of them,
  a custom ``nnx.Variable`` step counter written by the call;
- ``image_ops``: edge padding, ``roll`` and ``flip``, a three-operand ``einsum``, a
  cosine distance;
- ``float16``: float16 compute with float32 parameters and a static loss scale given
  as an argument.

Each equalled plain ``nnx.value_and_grad`` when written. (A model that ``sow``s values
and leaves them in the model is refused with a message saying what to do:
test_dropin_calls.py.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from feature_models import _case, _key, _metrics, classify
from flax import nnx
from zoo import Case


class Potential(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a = nnx.Linear(1, 16, rngs=rngs)
        self.b = nnx.Linear(16, 1, rngs=rngs)

    def energy(self, pos):
        d = jnp.sqrt(jnp.sum((pos[:, None] - pos[None]) ** 2, -1) + 1e-3)
        pair = self.b(jax.nn.softplus(self.a(d[..., None])))[..., 0]
        return 0.5 * jnp.sum(pair * (1.0 - jnp.eye(pos.shape[0])))

    def __call__(self, pos):
        energy, grad = jax.value_and_grad(self.energy)(pos)
        return energy, -grad


def forces_loss(model, pos, forces, energy):
    e, f = model(pos)
    return (e - energy) ** 2 + jnp.mean((f - forces) ** 2)


def forces() -> Case:
    pos, f = jax.random.normal(_key(801), (5, 3)), jax.random.normal(_key(802), (5, 3))
    factory = lambda: Potential(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("forces", factory, _metrics(forces_loss), (pos, f, jnp.array(1.0)),
                 "forces as -grad of the energy inside the forward")  # fmt: skip


class Embedder(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a = nnx.Linear(4, 16, rngs=rngs)
        self.b = nnx.Linear(16, 8, rngs=rngs)

    def __call__(self, x):
        return self.b(jnp.tanh(self.a(x)))


def sinkhorn_loss(model, x, z, eps=0.5):
    e = model(x)
    cost = jnp.sum((e[:, None] - z[None]) ** 2, -1)
    log_a = jnp.full(e.shape[0], -math.log(e.shape[0]))
    log_b = jnp.full(z.shape[0], -math.log(z.shape[0]))

    def body(_, fg):
        f, g = fg
        f = -eps * jax.nn.logsumexp((g[None] - cost) / eps + log_b[None], axis=1)
        g = -eps * jax.nn.logsumexp((f[:, None] - cost) / eps + log_a[:, None], axis=0)
        return f, g

    f, g = jax.lax.fori_loop(0, 5, body, (jnp.zeros_like(log_a), jnp.zeros_like(log_b)))
    plan = jnp.exp((f[:, None] + g[None] - cost) / eps + log_a[:, None] + log_b[None])
    return jnp.sum(plan * cost)


def sinkhorn() -> Case:
    x, z = jax.random.normal(_key(803), (6, 4)), jax.random.normal(_key(804), (7, 8))
    factory = lambda: Embedder(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("sinkhorn", factory, _metrics(sinkhorn_loss), (x, z),
                 "Sinkhorn iterations by fori_loop in the loss")  # fmt: skip


class MemoryLayer(nnx.Module):
    def __init__(self, d: int, memory: int, *, rngs: nnx.Rngs):
        self.q = nnx.Linear(d, d, rngs=rngs)
        self.kv = nnx.Linear(d, 2 * d, rngs=rngs)
        self.o = nnx.Linear(d, d, rngs=rngs)
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.memory = nnx.Cache(jax.random.normal(rngs.params(), (2, memory, d)))

    def __call__(self, x):
        context = jnp.concatenate([jax.lax.stop_gradient(self.memory[...]), x], axis=1)
        self.memory[...] = x[:, -self.memory.shape[1] :]
        q = self.q(self.norm(x))
        k, v = jnp.split(self.kv(self.norm(context)), 2, -1)
        t, s = x.shape[1], context.shape[1]
        causal = jnp.arange(s)[None] <= jnp.arange(t)[:, None] + s - t
        scores = jnp.where(causal, q @ k.swapaxes(1, 2) / math.sqrt(q.shape[-1]), -1e9)
        return x + self.o(jax.nn.softmax(scores, -1) @ v)


class MemoryLM(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(20, 16, rngs=rngs)
        self.layers = nnx.List([MemoryLayer(16, 4, rngs=rngs) for _ in range(2)])

    def __call__(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.embed.attend(h)


def next_token(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def xl() -> Case:
    tokens = jax.random.randint(_key(805), (2, 9), 0, 20)
    factory = lambda: MemoryLM(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("xl", factory, _metrics(next_token), (tokens,),
                 "segment memory in nnx.Cache, stop_gradient, tied output")  # fmt: skip


class Router(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.score = nnx.Linear(8, 1, rngs=rngs)
        self.mix = nnx.Linear(8, 8, rngs=rngs)
        self.wide, self.narrow = nnx.Linear(8, 8, rngs=rngs), nnx.Linear(8, 8, rngs=rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        s = self.score(x)[..., 0]
        _, top = jax.lax.top_k(s, 3)
        picked = jnp.take_along_axis(x, top[..., None], axis=1)
        gate = jax.nn.sigmoid(jnp.take_along_axis(s, top, axis=1))[..., None]
        h = self.mix(picked) * gate
        h = jax.lax.cond(jnp.mean(h) > 0, self.wide, lambda h: jnp.tanh(self.narrow(h)), h)
        return self.head(h.mean(1))


def router() -> Case:
    x, y = jax.random.normal(_key(806), (2, 10, 8)), jnp.array([0, 1])
    factory = lambda: Router(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("router", factory, _metrics(classify), (x, y),
                 "top_k with take_along_axis, lax.cond on a batch value")  # fmt: skip


class FPN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.c1 = nnx.Conv(3, 8, (3, 3), strides=2, rngs=rngs)
        self.c2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
        self.l1, self.l2 = nnx.Conv(8, 8, (1, 1), rngs=rngs), nnx.Conv(16, 8, (1, 1), rngs=rngs)
        self.norm = nnx.GroupNorm(8, num_groups=4, rngs=rngs)
        self.out = nnx.Conv(8, 2, (3, 3), rngs=rngs)

    def __call__(self, x):
        f1 = jax.nn.relu(self.c1(x))
        p2 = self.l2(jax.nn.relu(self.c2(f1)))
        up = jax.image.resize(p2, (*f1.shape[:3], p2.shape[3]), "bilinear")
        return self.out(self.norm(self.l1(f1) + up))


def focal(model, x, y):
    return optax.sigmoid_focal_loss(model(x), jax.nn.one_hot(y, 2)).mean()


def fpn() -> Case:
    x = jax.random.normal(_key(807), (2, 16, 16, 3))
    y = jax.random.randint(_key(808), (2, 8, 8), 0, 2)
    factory = lambda: FPN(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("fpn", factory, _metrics(focal), (x, y),
                 "jax.image.resize, GroupNorm, focal loss")  # fmt: skip


class PointNet(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.t1, self.t2 = nnx.Linear(3, 16, rngs=rngs), nnx.Linear(16, 9, rngs=rngs)
        self.m1, self.m2 = nnx.Linear(3, 32, rngs=rngs), nnx.Linear(32, 32, rngs=rngs)
        self.bn = nnx.BatchNorm(32, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.head = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, points):
        transform = self.t2(jnp.max(jax.nn.relu(self.t1(points)), axis=1))
        points = jnp.einsum("bnd,bde->bne", points, transform.reshape(-1, 3, 3) + jnp.eye(3))
        h = self.m2(jax.nn.relu(self.bn(self.m1(points))))
        return self.head(self.drop(jnp.max(h, axis=1)))


def smoothed(model, x, y):
    labels = optax.smooth_labels(jax.nn.one_hot(y, 4), 0.1)
    return optax.softmax_cross_entropy(model(x), labels).mean()


def pointnet() -> Case:
    x, y = jax.random.normal(_key(809), (3, 20, 3)), jnp.array([0, 2, 3])
    factory = lambda: PointNet(rngs=nnx.Rngs(0, dropout=1))  # noqa: E731
    return _case("pointnet", factory, _metrics(smoothed), (x, y),
                 "per-example einsum transform, max over points, BatchNorm, dropout")  # fmt: skip


class Steps(nnx.Variable):
    pass


class Stacked(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.stem = nnx.Sequential(
            nnx.Linear(6, 12, rngs=rngs), nnx.relu, nnx.LayerNorm(12, rngs=rngs), jax.nn.softplus
        )
        self.blocks = nnx.List(
            [nnx.Sequential(nnx.Linear(12, 12, rngs=rngs), jax.nn.celu) for _ in range(3)]
        )
        self.head = nnx.Linear(12, 1, rngs=rngs)
        self.steps = Steps(jnp.array(0, jnp.int32))

    def __call__(self, x):
        self.steps[...] += 1
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def logistic(model, x, y):
    return -jnp.mean(jax.nn.log_sigmoid(model(x) * y))


def sequential() -> Case:
    x, y = jax.random.normal(_key(810), (5, 6)), jnp.sign(jax.random.normal(_key(811), (5, 1)))
    factory = lambda: Stacked(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("sequential", factory, _metrics(logistic), (x, y),
                 "nnx.Sequential of functions, nnx.List, a custom Variable counter")  # fmt: skip


class ImageOps(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(2, 4, (3, 3), padding="VALID", rngs=rngs)
        self.w = nnx.Param(0.1 * jax.random.normal(rngs.params(), (4, 4, 3)))
        self.v = nnx.Param(jnp.ones((3,)))

    def __call__(self, x):
        x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
        x = 0.5 * (x + jnp.flip(jnp.roll(x, 2, axis=2), axis=1))
        h = jax.nn.relu(self.conv(x))
        return jnp.einsum("bhwc,cdk,k->bd", h, self.w[...], self.v[...]) / h.shape[1]


def cosine(model, x, y):
    return jnp.mean(optax.cosine_distance(model(x), y))


def image_ops() -> Case:
    x, y = jax.random.normal(_key(812), (2, 8, 8, 2)), jax.random.normal(_key(813), (2, 4))
    factory = lambda: ImageOps(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("image_ops", factory, _metrics(cosine), (x, y),
                 "edge padding, roll, flip, three-operand einsum")  # fmt: skip


class Half(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a = nnx.Linear(8, 32, dtype=jnp.float16, rngs=rngs)
        self.b = nnx.Linear(32, 1, dtype=jnp.float16, rngs=rngs)

    def __call__(self, x):
        return self.b(jax.nn.gelu(self.a(x.astype(jnp.float16)))).astype(jnp.float32)


def scaled(model, x, y, scale):
    return jnp.mean((model(x) - y) ** 2) * scale


def float16() -> Case:
    x, y = jax.random.normal(_key(814), (6, 8)), jax.random.normal(_key(815), (6, 1))
    factory = lambda: Half(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("float16", factory, _metrics(scaled), (x, y, jnp.array(128.0)),
                 "float16 compute, float32 parameters, a loss scale argument")  # fmt: skip


PATTERN_CASES: dict[str, Callable[[], Case]] = {
    "forces": forces,
    "sinkhorn": sinkhorn,
    "xl": xl,
    "router": router,
    "fpn": fpn,
    "pointnet": pointnet,
    "sequential": sequential,
    "image_ops": image_ops,
    "float16": float16,
}
