"""Small models that each use features the zoo (tests/zoo) does not, written as a new
user of the drop-in would bring them: ``CASES`` maps a name to a ``make() -> zoo.Case``
(``loss_fn`` returns the loss; ``aux_loss_fn`` returns ``(loss, metrics)`` with
``metrics["loss"] == loss``). tests/jax_exec/test_feature_models.py runs each through
``jax_exec.value_and_grad`` and ``jax_exec.plan`` against plain ``nnx.value_and_grad``.

- ``moe``: top-k routing (``lax.top_k``, one-hot dispatch by ``einsum``) and a
  load-balancing term in the loss;
- ``fnet``: FFT token mixing (complex intermediates, their real part kept);
- ``vqvae``: an ``argmin`` codebook lookup, straight-through and commitment terms
  (``stop_gradient``), ``ConvTranspose``;
- ``linear_recurrence``: a diagonal recurrence by ``lax.associative_scan``, ``cumsum``,
  ``sort``;
- ``refine``: a bfloat16 convolution, ``GroupNorm``, max and average pooling,
  ``lax.fori_loop`` and ``lax.cond`` on the data;
- ``perceiver``: latents cross-attending with ``jax.nn.dot_product_attention`` and a
  padding mask, ``MultiHeadAttention`` with dropout;
- ``ema``: a custom ``nnx.Variable`` updated in the forward, a module-held ``nnx.Rngs``
  stream for stochastic depth, an L2 term over every parameter in the loss;
- ``clip``: two towers, a learnable temperature read by the loss, a symmetric loss;
- ``byol``: one encoder (with BatchNorm) on two views, a stop-gradient target held as a
  non-parameter variable;
- ``ensemble``: ``nnx.vmap`` over members made with ``nnx.split_rngs``;
- ``scan_rnn``: ``lax.scan`` over time with a closed-over weight;
- ``quantized``: fake int8 quantization with a straight-through estimator, causal
  ``dot_product_attention`` with bfloat16 parameters, a dict batch;
- ``key_dropout``: a PRNG key and a Python float as arguments;
- ``flow``: ``slogdet``, ``cholesky`` and ``cho_solve``, ``solve``, ``cumprod``,
  ``logsumexp``;
- ``swin``: shifted windows (``jnp.roll``), window partitions, a relative position bias
  gathered from a table, label smoothing, a config dataclass held by the module.

tests/feature_models_loops.py holds more (``LOOP_CASES``), made with these helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from zoo import Case


def _case(name, factory, aux_loss_fn, args, notes) -> Case:
    """A case whose ``loss_fn`` is ``aux_loss_fn``'s loss."""
    return Case(name, factory, lambda *a: aux_loss_fn(*a)[0], aux_loss_fn, args, notes)


def _metrics(loss_fn: Callable) -> Callable:
    """``(loss, {"loss": loss})`` of ``loss_fn``."""

    def aux_loss_fn(*args):
        loss = loss_fn(*args)
        return loss, {"loss": loss}

    return aux_loss_fn


def _key(i: int) -> jax.Array:
    return jax.random.key(i)


def classify(model, x, y):
    """The mean cross-entropy of ``model(x)``'s logits against the labels ``y``."""
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


class MoE(nnx.Module):
    def __init__(self, d: int = 16, experts: int = 4, k: int = 2, *, rngs: nnx.Rngs):
        self.router = nnx.Linear(d, experts, rngs=rngs)
        self.w1 = nnx.Param(jax.random.normal(rngs.params(), (experts, d, 32)) * 0.1)
        self.w2 = nnx.Param(jax.random.normal(rngs.params(), (experts, 32, d)) * 0.1)
        self.out = nnx.Linear(d, 4, rngs=rngs)
        self.k, self.experts = k, experts

    def __call__(self, x):
        logits = self.router(x)
        top, idx = jax.lax.top_k(logits, self.k)
        onehot = jax.nn.one_hot(idx, self.experts)  # (tokens, k, experts)
        combine = jnp.einsum("tk,tke->te", jax.nn.softmax(top, -1), onehot)
        h = jax.nn.gelu(jnp.einsum("td,edf->tef", x, self.w1[...]))
        y = jnp.einsum("ted,te->td", jnp.einsum("tef,efd->ted", h, self.w2[...]), combine)
        balance = self.experts * jnp.sum(
            jnp.mean(jax.nn.softmax(logits, -1), 0) * jnp.mean(onehot.sum(1), 0)
        )
        return self.out(y + x), balance


def moe() -> Case:
    x, y = jax.random.normal(_key(1), (24, 16)), jax.random.randint(_key(2), (24,), 0, 4)

    def aux_loss_fn(model, x, y):
        logits, balance = model(x)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss = ce + 0.01 * balance
        return loss, {"loss": loss, "balance": balance}

    return _case("moe", lambda: MoE(rngs=nnx.Rngs(0)), aux_loss_fn, (x, y), "top-k routing")


class FNet(nnx.Module):
    def __init__(self, d: int = 16, *, rngs: nnx.Rngs):
        self.embed = nnx.Linear(8, d, rngs=rngs)
        self.norm1, self.norm2 = nnx.LayerNorm(d, rngs=rngs), nnx.LayerNorm(d, rngs=rngs)
        self.ff, self.head = nnx.Linear(d, d, rngs=rngs), nnx.Linear(d, 3, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        h = self.norm1(h + jnp.fft.fft2(h).real)
        h = self.norm2(h + jax.nn.relu(self.ff(h)))
        return self.head(h.mean(1))


def fnet() -> Case:
    x, y = jax.random.normal(_key(1), (4, 10, 8)), jax.random.randint(_key(2), (4,), 0, 3)

    factory = lambda: FNet(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("fnet", factory, _metrics(classify), (x, y), "FFT mixing")


class VQVAE(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.enc1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.enc2 = nnx.Conv(8, 4, (3, 3), strides=2, rngs=rngs)
        self.codebook = nnx.Param(jax.random.normal(rngs.params(), (16, 4)))
        self.dec1 = nnx.ConvTranspose(4, 8, (3, 3), strides=(2, 2), rngs=rngs)
        self.dec2 = nnx.Conv(8, 1, (3, 3), rngs=rngs)

    def __call__(self, x):
        z = self.enc2(jax.nn.relu(self.enc1(x)))
        codes = jnp.argmin(jnp.sum((z[..., None, :] - self.codebook[...]) ** 2, -1), -1)
        q = jnp.take(self.codebook[...], codes, axis=0)
        commitment = jnp.mean((jax.lax.stop_gradient(q) - z) ** 2)
        codebook = jnp.mean((q - jax.lax.stop_gradient(z)) ** 2)
        straight = z + jax.lax.stop_gradient(q - z)
        return self.dec2(jax.nn.relu(self.dec1(straight))), commitment, codebook


def vqvae() -> Case:
    x = jax.random.normal(_key(1), (2, 8, 8, 1))

    def loss_fn(model, x):
        recon, commitment, codebook = model(x)
        return jnp.mean((recon - x) ** 2) + codebook + 0.25 * commitment

    factory = lambda: VQVAE(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("vqvae", factory, _metrics(loss_fn), (x,), "argmin codebook")


class LinearRecurrence(nnx.Module):
    def __init__(self, d: int = 8, *, rngs: nnx.Rngs):
        self.inp, self.out = nnx.Linear(4, d, rngs=rngs), nnx.Linear(d, 2, rngs=rngs)
        self.decay = nnx.Param(jnp.linspace(0.5, 0.95, d))

    def __call__(self, x):  # (batch, time, 4)
        u = self.inp(x)
        a = jnp.broadcast_to(self.decay[...], u.shape)
        _, h = jax.lax.associative_scan(lambda l, r: (r[0] * l[0], r[0] * l[1] + r[1]), (a, u),
                                        axis=1)  # fmt: skip
        h = jnp.sort(h + 0.1 * jnp.cumsum(u, axis=1), axis=1)
        return self.out(h[:, -3:].mean(1))


def linear_recurrence() -> Case:
    x, y = jax.random.normal(_key(1), (3, 12, 4)), jax.random.normal(_key(2), (3, 2))
    factory = lambda: LinearRecurrence(rngs=nnx.Rngs(0))  # noqa: E731
    loss_fn = lambda model, x, y: jnp.mean((model(x) - y) ** 2)  # noqa: E731
    return _case("linear_recurrence", factory, _metrics(loss_fn), (x, y), "associative scan")


class Refine(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(3, 8, (3, 3), dtype=jnp.bfloat16, rngs=rngs)
        self.norm = nnx.GroupNorm(8, num_groups=2, rngs=rngs)
        self.step, self.head = nnx.Linear(8, 8, rngs=rngs), nnx.Linear(8, 5, rngs=rngs)

    def __call__(self, x):
        h = self.norm(self.conv(x).astype(jnp.float32))
        h = nnx.max_pool(h, (2, 2), strides=(2, 2))
        h = nnx.avg_pool(h, (2, 2), strides=(2, 2)).mean((1, 2))
        w = self.step.kernel[...]
        h = jax.lax.fori_loop(0, 3, lambda i, z: jnp.tanh(z @ w) + z, h)
        h = jax.lax.cond(jnp.sum(h) > 0, lambda z: z * 2.0, lambda z: z - 1.0, h)
        return self.head(h)


def refine() -> Case:
    x, y = jax.random.normal(_key(1), (2, 8, 8, 3)), jax.random.randint(_key(2), (2,), 0, 5)

    factory = lambda: Refine(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("refine", factory, _metrics(classify), (x, y), "bf16, fori_loop, cond")


class Perceiver(nnx.Module):
    def __init__(self, d: int = 16, *, rngs: nnx.Rngs):
        self.latents = nnx.Param(jax.random.normal(rngs.params(), (4, d)) * 0.1)
        self.q, self.kv = nnx.Linear(d, d, rngs=rngs), nnx.Linear(6, 2 * d, rngs=rngs)
        self.attend = nnx.MultiHeadAttention(num_heads=2, in_features=d, decode=False,
                                             rngs=rngs)  # fmt: skip
        self.drop, self.head = nnx.Dropout(0.2, rngs=rngs), nnx.Linear(d, 1, rngs=rngs)

    def __call__(self, x, mask):
        b, n = x.shape[:2]
        q = self.q(jnp.broadcast_to(self.latents[...], (b, *self.latents.shape)))
        k, v = jnp.split(self.kv(x), 2, -1)
        heads = lambda t, m: t.reshape(b, m, 2, 8)  # noqa: E731
        h = jax.nn.dot_product_attention(heads(q, 4), heads(k, n), heads(v, n),
                                         mask=mask[:, None, None, :]).reshape(b, 4, 16)  # fmt: skip
        h = h + self.drop(self.attend(h))
        return self.head(h.mean(1))[:, 0]


def perceiver() -> Case:
    x, y = jax.random.normal(_key(1), (3, 10, 6)), jax.random.normal(_key(2), (3,))
    mask = jnp.arange(10)[None] < jnp.array([10, 7, 4])[:, None]
    factory = lambda: Perceiver(rngs=nnx.Rngs(0))  # noqa: E731
    loss_fn = lambda model, x, mask, y: jnp.mean((model(x, mask) - y) ** 2)  # noqa: E731
    return _case("perceiver", factory, _metrics(loss_fn), (x, mask, y), "masked attention")


class Stats(nnx.Variable):
    pass


class EMA(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.l1, self.l2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs)
        self.l3 = nnx.Linear(16, 2, rngs=rngs)
        self.mean, self.count = Stats(jnp.zeros(16)), Stats(jnp.array(0, jnp.int32))
        self.rngs = nnx.Rngs(droppath=7)

    def __call__(self, x):
        h = jax.nn.relu(self.l1(x))
        self.mean[...] = 0.9 * self.mean[...] + 0.1 * h.mean(0)
        self.count[...] = self.count[...] + 1
        keep = jax.random.bernoulli(self.rngs.droppath(), 0.8, (x.shape[0], 1))
        h = h + jnp.where(keep, jax.nn.gelu(self.l2(h)) / 0.8, 0.0)
        return self.l3(h - self.mean[...])


def ema() -> Case:
    x, y = jax.random.normal(_key(1), (6, 8)), jax.random.normal(_key(2), (6, 2))

    def loss_fn(model, x, y):
        l2 = sum(jnp.sum(p**2) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
        return jnp.mean((model(x) - y) ** 2) + 1e-3 * l2

    factory = lambda: EMA(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("ema", factory, _metrics(loss_fn), (x, y), "custom Variable, L2 in loss")


class CLIP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.image = nnx.Sequential(
            nnx.Conv(3, 8, (3, 3), strides=2, rngs=rngs), nnx.relu,
            nnx.Conv(8, 8, (3, 3), strides=2, rngs=rngs),
        )  # fmt: skip
        self.image_proj = nnx.Linear(8, 16, rngs=rngs)
        self.embed = nnx.Embed(32, 16, rngs=rngs)
        self.text = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.text_proj = nnx.Linear(16, 16, use_bias=False, rngs=rngs)
        self.logit_scale = nnx.Param(jnp.array(np.log(1 / 0.07), jnp.float32))

    def __call__(self, images, tokens):
        i = self.image_proj(self.image(images).mean((1, 2)))
        t = self.embed(tokens)
        t = self.text_proj(self.norm(t + self.text(t))[:, -1])
        unit = lambda v: v / jnp.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
        return unit(i), unit(t)


def clip() -> Case:
    images = jax.random.normal(_key(1), (4, 8, 8, 3))
    tokens = jax.random.randint(_key(2), (4, 6), 0, 32)

    def aux_loss_fn(model, images, tokens):
        i, t = model(images, tokens)
        scale = jnp.exp(jnp.clip(model.logit_scale[...], 0, 4.6))
        logits, labels = scale * i @ t.T, jnp.arange(4)
        ce = optax.softmax_cross_entropy_with_integer_labels
        loss = (ce(logits, labels).mean() + ce(logits.T, labels).mean()) / 2
        return loss, {"loss": loss, "scale": scale}

    factory = lambda: CLIP(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("clip", factory, aux_loss_fn, (images, tokens), "two towers, temperature")


class Target(nnx.Variable):
    pass


class BYOL(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.encoder = nnx.Sequential(
            nnx.Linear(8, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs), nnx.relu,
            nnx.Linear(16, 8, rngs=rngs),
        )  # fmt: skip
        self.predictor = nnx.Linear(8, 8, rngs=rngs)
        self.target = Target(jax.random.normal(_key(9), (8, 8)) * 0.3)

    def __call__(self, v1, v2):
        z1, z2 = self.predictor(self.encoder(v1)), self.predictor(self.encoder(v2))
        t1 = jax.lax.stop_gradient(jnp.tanh(v2 @ self.target[...]))
        t2 = jax.lax.stop_gradient(jnp.tanh(v1 @ self.target[...]))

        def cosine(a, b):
            return jnp.sum(a * b, -1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))

        return jnp.mean(2 - 2 * cosine(z1, t1)) + jnp.mean(2 - 2 * cosine(z2, t2))


def byol() -> Case:
    v1 = jax.random.normal(_key(1), (6, 8))
    v2 = v1 + 0.1 * jax.random.normal(_key(2), (6, 8))
    factory = lambda: BYOL(rngs=nnx.Rngs(0))  # noqa: E731
    loss_fn = lambda model, v1, v2: model(v1, v2)  # noqa: E731
    return _case("byol", factory, _metrics(loss_fn), (v1, v2), "shared encoder, two views")


class Ensemble(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def members(rngs):
            return nnx.Linear(6, 4, rngs=rngs)

        self.members = members(rngs)
        self.head = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x):
        @nnx.vmap(in_axes=(0, None), out_axes=0)
        def apply(member, x):
            return jax.nn.tanh(member(x))

        return self.head(apply(self.members, x).mean(0))[:, 0]


def ensemble() -> Case:
    x, y = jax.random.normal(_key(1), (5, 6)), jax.random.normal(_key(2), (5,))
    factory = lambda: Ensemble(rngs=nnx.Rngs(0))  # noqa: E731
    loss_fn = lambda model, x, y: jnp.mean((model(x) - y) ** 2)  # noqa: E731
    return _case("ensemble", factory, _metrics(loss_fn), (x, y), "nnx.vmap members")


class ScanRNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.wx = nnx.Linear(4, 12, rngs=rngs)
        self.wh = nnx.Linear(12, 12, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(12, 3, rngs=rngs)

    def __call__(self, xs):  # (time, batch, 4)
        wh = self.wh.kernel[...]

        def step(h, u):
            h = jnp.tanh(u + h @ wh)
            return h, h

        h, hs = jax.lax.scan(step, jnp.zeros((xs.shape[1], 12)), self.wx(xs))
        return self.out(hs.mean(0) + h)


def scan_rnn() -> Case:
    x, y = jax.random.normal(_key(1), (9, 3, 4)), jax.random.randint(_key(2), (3,), 0, 3)

    factory = lambda: ScanRNN(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("scan_rnn", factory, _metrics(classify), (x, y), "lax.scan over time")


class Quantized(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.l1, self.l2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs)
        self.qkv = nnx.Linear(16, 48, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, x):  # (batch, time, 8)
        h = self.l1(x)
        scale = jnp.max(jnp.abs(h)) / 127.0
        h = h + jax.lax.stop_gradient(jnp.clip(jnp.round(h / scale), -127, 127) * scale - h)
        b, t = x.shape[:2]
        q, k, v = (
            a.reshape(b, t, 2, 8) for a in jnp.split(self.qkv(h.astype(jnp.bfloat16)), 3, -1)
        )
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, 16)
        return self.l2(h + a.astype(jnp.float32))


def quantized() -> Case:
    batch = {"x": jax.random.normal(_key(1), (2, 5, 8)),
             "y": jax.random.randint(_key(2), (2, 5), 0, 4)}  # fmt: skip

    def loss_fn(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    factory = lambda: Quantized(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("quantized", factory, _metrics(loss_fn), (batch,), "fake int8, dict batch")


class KeyDropout(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.l1, self.l2 = nnx.Linear(6, 12, rngs=rngs), nnx.Linear(12, 1, rngs=rngs)

    def __call__(self, x, key, rate):
        h = jax.nn.relu(self.l1(x))
        keep = jax.random.bernoulli(key, 1 - rate, h.shape)
        return self.l2(jnp.where(keep, h / (1 - rate), 0))[:, 0]


def key_dropout() -> Case:
    x, y = jax.random.normal(_key(1), (7, 6)), jax.random.normal(_key(2), (7,))

    def loss_fn(model, x, y, key, rate):
        return jnp.mean((model(x, key, rate) - y) ** 2)

    factory = lambda: KeyDropout(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("key_dropout", factory, _metrics(loss_fn), (x, y, _key(3), 0.25), "key arg")


class Flow(nnx.Module):
    def __init__(self, d: int = 4, *, rngs: nnx.Rngs):
        self.w = nnx.Param(jnp.eye(d) + 0.1 * jax.random.normal(rngs.params(), (d, d)))
        self.b = nnx.Param(jnp.zeros(d))
        self.net = nnx.Linear(d, d, rngs=rngs)
        self.logits = nnx.Param(jnp.zeros(3))

    def __call__(self, x):
        z = x @ self.w[...] + self.b[...]
        _, logdet = jnp.linalg.slogdet(self.w[...])
        h = jax.nn.softplus(self.net(z))
        gram = h.T @ h + jnp.eye(h.shape[1])
        chol = jnp.linalg.cholesky(gram)
        ones = jnp.ones(h.shape[1])
        solved = jax.scipy.linalg.cho_solve((chol, True), ones) + jnp.linalg.solve(gram, ones)
        mixture = jax.scipy.special.logsumexp(
            jax.nn.log_softmax(self.logits[...]) - jnp.sum(z**2, 1, keepdims=True) / 2, axis=1
        )
        gates = jnp.cumprod(jax.nn.sigmoid(h), axis=1).sum()
        return -jnp.mean(mixture) - logdet + 1e-2 * jnp.sum(solved) + 1e-3 * gates


def flow() -> Case:
    x = jax.random.normal(_key(1), (10, 4))
    factory = lambda: Flow(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("flow", factory, _metrics(lambda model, x: model(x)), (x,), "linear algebra")


@dataclass
class SwinConfig:
    dim: int = 16
    heads: int = 2
    window: int = 2
    depths: list = field(default_factory=lambda: [2])


def relative_index(w: int) -> np.ndarray:
    coords = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (w - 1)
    return rel[..., 0] * (2 * w - 1) + rel[..., 1]


class SwinBlock(nnx.Module):
    def __init__(self, cfg: SwinConfig, shift: bool, *, rngs: nnx.Rngs):
        self.cfg, self.shift = cfg, shift
        self.qkv = nnx.Linear(cfg.dim, 3 * cfg.dim, rngs=rngs)
        self.proj = nnx.Linear(cfg.dim, cfg.dim, rngs=rngs)
        shape = ((2 * cfg.window - 1) ** 2, cfg.heads)
        self.table = nnx.Param(jax.random.normal(rngs.params(), shape) * 0.02)
        self.index = jnp.asarray(relative_index(cfg.window))
        self.norm1, self.norm2 = (
            nnx.LayerNorm(cfg.dim, rngs=rngs),
            nnx.LayerNorm(cfg.dim, rngs=rngs),
        )
        self.mlp = nnx.Sequential(
            nnx.Linear(cfg.dim, 2 * cfg.dim, rngs=rngs), nnx.gelu,
            nnx.Linear(2 * cfg.dim, cfg.dim, rngs=rngs),
        )  # fmt: skip
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):  # (batch, H, W, channels)
        b, H, W, c = x.shape
        w, heads = self.cfg.window, self.cfg.heads
        y = self.norm1(x)
        if self.shift:
            y = jnp.roll(y, (-w // 2, -w // 2), axis=(1, 2))
        y = y.reshape(b, H // w, w, W // w, w, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
        q, k, v = (a.reshape(-1, w * w, heads, c // heads) for a in jnp.split(self.qkv(y), 3, -1))
        att = jnp.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(c // heads)
        att = jax.nn.softmax(att + self.table[...][self.index].transpose(2, 0, 1)[None], -1)
        o = jnp.einsum("nhqk,nkhd->nqhd", self.drop(att), v).reshape(-1, w * w, c)
        o = self.proj(o).reshape(b, H // w, W // w, w, w, c).transpose(0, 1, 3, 2, 4, 5)
        o = o.reshape(b, H, W, c)
        if self.shift:
            o = jnp.roll(o, (w // 2, w // 2), axis=(1, 2))
        x = x + o
        return x + self.mlp(self.norm2(x))


class Swin(nnx.Module):
    def __init__(self, cfg: SwinConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.patch = nnx.Conv(3, cfg.dim, (2, 2), strides=(2, 2), rngs=rngs)
        self.blocks = nnx.List(
            [SwinBlock(cfg, i % 2 == 1, rngs=rngs) for i in range(cfg.depths[0])]
        )
        self.head = nnx.Linear(cfg.dim, 5, rngs=rngs)

    def __call__(self, images):
        x = self.patch(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((1, 2)))


def swin() -> Case:
    images = jax.random.normal(_key(1), (2, 8, 8, 3))
    labels = jax.random.randint(_key(2), (2,), 0, 5)

    def aux_loss_fn(model, images, labels):
        logits = model(images)
        targets = optax.smooth_labels(jax.nn.one_hot(labels, 5), 0.1)
        loss = optax.softmax_cross_entropy(logits, targets).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

    factory = lambda: Swin(SwinConfig(), rngs=nnx.Rngs(0))  # noqa: E731
    return _case("swin", factory, aux_loss_fn, (images, labels), "shifted windows")


CASES: dict[str, Callable[[], Case]] = {
    "moe": moe,
    "fnet": fnet,
    "vqvae": vqvae,
    "linear_recurrence": linear_recurrence,
    "refine": refine,
    "perceiver": perceiver,
    "ema": ema,
    "clip": clip,
    "byol": byol,
    "ensemble": ensemble,
    "scan_rnn": scan_rnn,
    "quantized": quantized,
    "key_dropout": key_dropout,
    "flow": flow,
    "swin": swin,
}
