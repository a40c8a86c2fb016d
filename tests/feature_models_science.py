"""More feature models (test_feature_models.py runs them with its helpers): layers of
scientific and generative models and the user's own checkpointing, written at stop 54 as
a new user would:

- ``fno``: a Fourier neural operator, complex64 ``nnx.Param`` spectral weights applied
  between ``rfft`` and ``irfft`` (complex gradients, complex residuals);
- ``sparse_gcn``: a graph convolution over a ``jax.experimental.sparse.BCOO``
  adjacency given as an argument (``bcoo_dot_general``);
- ``mdn``: a mixture density network, ``jax.scipy.stats.norm.logpdf`` and
  ``logsumexp``, a softplus scale;
- ``gumbel``: a categorical VAE, Gumbel-softmax samples from a module-held ``nnx.Rngs``
  stream with a straight-through hard sample (``one_hot`` of ``argmax``), a KL term;
- ``capsule``: dynamic routing by agreement, a ``fori_loop`` of softmax and squash;
- ``nerf``: positional encoding and volume rendering (``cumsum`` of densities, ``exp``
  transmittance, ``diff`` of sample depths given as an argument);
- ``hypernet``: a hypernetwork generating a layer's normalized weights per example
  (``jnp.linalg.norm``, a batched ``einsum``);
- ``siren_film``: sine activations with FiLM scales and shifts from an ``Embed``;
- ``remat_policy``: the user's ``nnx.remat`` with a policy
  (``dots_with_no_batch_dims_saveable``) and with ``prevent_cse=False``;
- ``static_ckpt``: ``jax.checkpoint`` with ``static_argnums`` choosing the activation.

Each equalled plain ``nnx.value_and_grad`` when written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from feature_models import _case, _key, _metrics, classify
from flax import nnx
from jax.experimental import sparse
from zoo import Case


def _made(name: str, module: type, loss_fn: Callable, args: tuple, notes: str) -> Case:
    """The case of ``module(rngs=nnx.Rngs(0))`` and ``loss_fn`` (its metrics: the loss)."""
    return _case(name, lambda: module(rngs=nnx.Rngs(0)), _metrics(loss_fn), args, notes)


class SpectralConv(nnx.Module):
    def __init__(self, c, modes, *, rngs):
        scale = 1.0 / (c * c)
        re = scale * jax.random.normal(rngs.params(), (c, c, modes))
        im = scale * jax.random.normal(rngs.params(), (c, c, modes))
        self.w = nnx.Param((re + 1j * im).astype(jnp.complex64))
        self.modes = modes

    def __call__(self, x):  # (b, n, c)
        xf = jnp.fft.rfft(x, axis=1)  # (b, n//2+1, c)
        out = jnp.einsum("bmi,iom->bmo", xf[:, : self.modes], self.w[...])
        full = jnp.zeros((x.shape[0], x.shape[1] // 2 + 1, out.shape[-1]), jnp.complex64)
        full = full.at[:, : self.modes].set(out)
        return jnp.fft.irfft(full, n=x.shape[1], axis=1)


class FNO(nnx.Module):
    def __init__(self, *, rngs):
        self.lift = nnx.Linear(2, 8, rngs=rngs)
        self.spectral = nnx.List([SpectralConv(8, 4, rngs=rngs) for _ in range(3)])
        self.pointwise = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(3)])
        self.proj = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        h = self.lift(x)
        for s, p in zip(self.spectral, self.pointwise, strict=False):
            h = jax.nn.gelu(s(h) + p(h))
        return self.proj(h)[..., 0]


def fno() -> Case:
    x = jax.random.normal(_key(1), (4, 16, 2))
    y = jnp.sin(jnp.cumsum(x[..., 0], 1))

    def loss(m, x, y):
        return jnp.mean((m(x) - y) ** 2)

    return _made("fno", FNO, loss, (x, y), "complex64 params")


class SparseGCN(nnx.Module):
    def __init__(self, *, rngs):
        self.layers = nnx.List([nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs)])
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, adj, x):
        h = x
        for layer in self.layers:
            h = jax.nn.relu(adj @ layer(h))
        return self.out(self.norm(h))


def sparse_gcn() -> Case:
    n = 12
    dense = (jax.random.uniform(_key(2), (n, n)) < 0.25).astype(jnp.float32) + jnp.eye(n)
    dense = dense / dense.sum(1, keepdims=True)
    adj = sparse.BCOO.fromdense(dense)
    x = jax.random.normal(_key(1), (n, 8))
    y = jax.random.randint(_key(3), (n,), 0, 3)

    def loss(m, adj, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(m(adj, x), y).mean()

    return _made("sparse_gcn", SparseGCN, loss, (adj, x, y), "BCOO adjacency")


class MDN(nnx.Module):
    def __init__(self, k=4, *, rngs):
        self.body = nnx.Sequential(
            nnx.Linear(3, 32, rngs=rngs), jax.nn.tanh, nnx.Linear(32, 32, rngs=rngs), jax.nn.tanh
        )
        self.pi = nnx.Linear(32, k, rngs=rngs)
        self.mu = nnx.Linear(32, k, rngs=rngs)
        self.s = nnx.Linear(32, k, rngs=rngs)

    def __call__(self, x, y):
        h = self.body(x)
        logpi = jax.nn.log_softmax(self.pi(h))
        sigma = jax.nn.softplus(self.s(h)) + 1e-3
        lp = jax.scipy.stats.norm.logpdf(y[:, None], self.mu(h), sigma)
        return -jnp.mean(jax.scipy.special.logsumexp(logpi + lp, axis=1))


def mdn() -> Case:
    x = jax.random.normal(_key(1), (32, 3))
    y = jnp.sin(x.sum(1)) + 0.1 * jax.random.normal(_key(2), (32,))
    return _made("mdn", MDN, lambda m, x, y: m(x, y), (x, y), "mixture density")


class GumbelVAE(nnx.Module):
    def __init__(self, *, rngs):
        self.enc = nnx.Linear(12, 24, rngs=rngs)
        self.logits = nnx.Linear(24, 3 * 4, rngs=rngs)
        self.dec = nnx.Linear(12, 24, rngs=rngs)
        self.out = nnx.Linear(24, 12, rngs=rngs)
        self.rngs = rngs

    def __call__(self, x, tau=0.7):
        logits = self.logits(jax.nn.relu(self.enc(x))).reshape(-1, 3, 4)
        g = jax.random.gumbel(self.rngs.noise(), logits.shape)
        soft = jax.nn.softmax((logits + g) / tau)
        hard = jax.nn.one_hot(jnp.argmax(soft, -1), 4)
        z = soft + jax.lax.stop_gradient(hard - soft)
        recon = self.out(jax.nn.relu(self.dec(z.reshape(x.shape[0], -1))))
        q = jax.nn.softmax(logits)
        kl = jnp.sum(q * (jnp.log(q + 1e-10) - jnp.log(0.25)), axis=(1, 2))
        return jnp.mean(optax.sigmoid_binary_cross_entropy(recon, x).sum(1) + kl)


def gumbel() -> Case:
    x = (jax.random.uniform(_key(1), (16, 12)) < 0.5).astype(jnp.float32)
    return _case(
        "gumbel",
        lambda: GumbelVAE(rngs=nnx.Rngs(0, noise=1)),
        _metrics(lambda m, x: m(x)),
        (x,),
        "gumbel ST, module rngs",
    )


class Capsules(nnx.Module):
    def __init__(self, *, rngs):
        self.prim = nnx.Linear(16, 8 * 4, rngs=rngs)
        self.W = nnx.Param(0.1 * jax.random.normal(rngs.params(), (8, 3, 4, 6)))

    def __call__(self, x, iters=3):
        u = self.prim(x).reshape(-1, 8, 4)
        u = u / (1 + jnp.sum(u**2, -1, keepdims=True))
        uhat = jnp.einsum("bip,ijpq->bijq", u, self.W[...])

        def squash(s):
            n2 = jnp.sum(s**2, -1, keepdims=True)
            return n2 / (1 + n2) * s / jnp.sqrt(n2 + 1e-8)

        def body(_, b):
            c = jax.nn.softmax(b, axis=2)
            v = squash(jnp.einsum("bij,bijq->bjq", c, uhat))
            return b + jnp.einsum("bijq,bjq->bij", uhat, v)

        b = jax.lax.fori_loop(0, iters - 1, body, jnp.zeros(uhat.shape[:3]))
        v = squash(jnp.einsum("bij,bijq->bjq", jax.nn.softmax(b, axis=2), uhat))
        return jnp.linalg.norm(v, axis=-1)


def capsule() -> Case:
    x = jax.random.normal(_key(1), (8, 16))
    y = jax.random.randint(_key(2), (8,), 0, 3)

    def loss(m, x, y):
        lengths = m(x)
        t = jax.nn.one_hot(y, 3)
        return jnp.mean(
            jnp.sum(
                t * jax.nn.relu(0.9 - lengths) ** 2
                + 0.5 * (1 - t) * jax.nn.relu(lengths - 0.1) ** 2,
                1,
            )
        )

    return _made("capsule", Capsules, loss, (x, y), "routing by fori_loop")


class NeRF(nnx.Module):
    def __init__(self, freqs=4, *, rngs):
        self.freqs = freqs
        self.mlp = nnx.Sequential(
            nnx.Linear(3 * 2 * freqs + 3, 32, rngs=rngs),
            jax.nn.relu,
            nnx.Linear(32, 32, rngs=rngs),
            jax.nn.relu,
            nnx.Linear(32, 4, rngs=rngs),
        )

    def __call__(self, origins, dirs, t):
        pts = origins[:, None] + dirs[:, None] * t[None, :, None]  # (rays, samples, 3)
        scales = 2.0 ** jnp.arange(self.freqs)
        enc = (pts[..., None] * scales).reshape(*pts.shape[:2], -1)
        feats = jnp.concatenate([pts, jnp.sin(enc), jnp.cos(enc)], -1)
        out = self.mlp(feats)
        sigma, rgb = jax.nn.softplus(out[..., 0]), jax.nn.sigmoid(out[..., 1:])
        delta = jnp.concatenate([jnp.diff(t), jnp.array([1e10])])
        alpha = 1 - jnp.exp(-sigma * delta)
        trans = jnp.exp(
            -jnp.concatenate(
                [jnp.zeros((alpha.shape[0], 1)), jnp.cumsum(sigma * delta, 1)[:, :-1]], 1
            )
        )
        w = alpha * trans
        return jnp.sum(w[..., None] * rgb, 1)


def nerf() -> Case:
    o = jax.random.normal(_key(1), (16, 3))
    d = jax.random.normal(_key(2), (16, 3))
    t = jnp.linspace(0.1, 2.0, 8)
    target = jax.random.uniform(_key(3), (16, 3))

    def loss(m, o, d, t, y):
        return jnp.mean((m(o, d, t) - y) ** 2)

    return _made("nerf", NeRF, loss, (o, d, t, target), "volume rendering")


class HyperNet(nnx.Module):
    def __init__(self, *, rngs):
        self.embed = nnx.Embed(5, 8, rngs=rngs)
        self.gen = nnx.Linear(8, 6 * 16 + 16, rngs=rngs)
        self.head = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, task, x):
        p = self.gen(self.embed(task))
        w = (
            p[:, : 6 * 16].reshape(-1, 6, 16)
            / jnp.linalg.norm(p[:, : 6 * 16], axis=1)[:, None, None]
        )
        b = p[:, 6 * 16 :]
        h = jnp.tanh(jnp.einsum("bi,bio->bo", x, w) + b)
        return self.head(h)[:, 0]


def hypernet() -> Case:
    task = jax.random.randint(_key(1), (16,), 0, 5)
    x = jax.random.normal(_key(2), (16, 6))
    y = jax.random.normal(_key(3), (16,))

    def loss(m, task, x, y):
        return jnp.mean((m(task, x) - y) ** 2)

    return _made("hypernet", HyperNet, loss, (task, x, y), "generated weights")


class SirenFilm(nnx.Module):
    def __init__(self, *, rngs):
        self.first = nnx.Linear(2, 32, rngs=rngs)
        self.hidden = nnx.List([nnx.Linear(32, 32, rngs=rngs) for _ in range(3)])
        self.film = nnx.Embed(4, 2 * 32 * 3, rngs=rngs)
        self.out = nnx.Linear(32, 3, rngs=rngs)

    def __call__(self, coords, cls):
        h = jnp.sin(30.0 * self.first(coords))
        gb = self.film(cls).reshape(-1, 3, 2, 32)
        for i, layer in enumerate(self.hidden):
            h = jnp.sin(gb[:, i, 0, None] * layer(h) + gb[:, i, 1, None])
        return self.out(h)


def siren_film() -> Case:
    c = jax.random.uniform(_key(1), (4, 10, 2), minval=-1, maxval=1)
    cls = jnp.arange(4) % 4
    y = jax.random.normal(_key(2), (4, 10, 3))

    def loss(m, c, cls, y):
        return jnp.mean((m(c, cls) - y) ** 2)

    return _made("siren_film", SirenFilm, loss, (c, cls, y), "sin, FiLM")


class PolicyBlock(nnx.Module):
    def __init__(self, d, *, rngs):
        self.a = nnx.Linear(d, 2 * d, rngs=rngs)
        self.b = nnx.Linear(2 * d, d, rngs=rngs)
        self.n = nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, x):
        return x + self.b(jax.nn.gelu(self.a(self.n(x))))


class RematPolicy(nnx.Module):
    def __init__(self, *, rngs):
        self.blocks = nnx.List([PolicyBlock(16, rngs=rngs) for _ in range(4)])
        self.inp = nnx.Linear(8, 16, rngs=rngs)
        self.out = nnx.Linear(16, 5, rngs=rngs)

    def __call__(self, x):
        h = self.inp(x)
        for i, blk in enumerate(self.blocks):
            if i % 2 == 0:
                h = nnx.remat(
                    lambda b, h: b(h),
                    policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                )(blk, h)
            else:
                h = nnx.remat(lambda b, h: b(h), prevent_cse=False)(blk, h)
        return self.out(h)


def remat_policy() -> Case:
    x = jax.random.normal(_key(1), (8, 6, 8))
    y = jax.random.randint(_key(2), (8, 6), 0, 5)
    return _made("remat_policy", RematPolicy, classify, (x, y), "user remat with policy")


@functools.partial(jax.checkpoint, static_argnums=(2,))
def mixed(x, w, mode):
    return jnp.tanh(x @ w) if mode == "tanh" else jax.nn.relu(x @ w)


class StaticCkpt(nnx.Module):
    def __init__(self, *, rngs):
        self.w1 = nnx.Param(0.3 * jax.random.normal(rngs.params(), (8, 16)))
        self.w2 = nnx.Param(0.3 * jax.random.normal(rngs.params(), (16, 16)))
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(mixed(mixed(x, self.w1[...], "tanh"), self.w2[...], "relu"))


def static_ckpt() -> Case:
    x = jax.random.normal(_key(1), (12, 8))
    y = jax.random.randint(_key(2), (12,), 0, 2)
    return _made("static_ckpt", StaticCkpt, classify, (x, y), "jax.checkpoint static_argnums")


SCIENCE_CASES: dict[str, Callable[[], Case]] = {
    f.__name__: f
    for f in (
        fno,
        sparse_gcn,
        mdn,
        gumbel,
        capsule,
        nerf,
        hypernet,
        siren_film,
        remat_policy,
        static_ckpt,
    )
}
