"""More feature models (besides tests/feature_models.py's; test_feature_models.py runs
them with its helpers): losses that differentiate or sample, and sampling at computed
coordinates, written at stop 51 as a new user would:

- ``pinn``: a physics-informed network whose loss holds the second derivative of the
  network in its input (``jax.grad`` of ``jax.grad`` inside ``loss_fn``, under
  ``jax.vmap``) and boundary terms: the planner differentiates a program that is
  itself a derivative;
- ``wgan_gp``: a WGAN-GP critic, the gradient penalty on inputs mixed between real and
  fake samples (``jax.grad`` of the critic in its input inside the loss);
- ``diffusion``: a DDPM noise-prediction loss drawing its timesteps and noise from a
  key argument inside ``loss_fn``, with a sinusoidal timestep embedding;
- ``stn``: a spatial transformer: a predicted affine grid sampled by
  ``jax.scipy.ndimage.map_coordinates`` (gathers at computed indices, linear weights).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from feature_models import _case, _key, _metrics, classify
from flax import nnx
from zoo import Case


class PINN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(1, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 16, rngs=rngs)
        self.l3 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.l3(jnp.tanh(self.l2(jnp.tanh(self.l1(x)))))


def poisson_residual(model, xs):
    """u'' + u = sin(x) on ``xs``, u(0) = 0, u(1) = 1, by squared residuals."""

    def u(x):  # a scalar in, a scalar out
        return model(x.reshape(1, 1))[0, 0]

    u_xx = jax.vmap(jax.grad(jax.grad(u)))(xs)
    residual = u_xx + jax.vmap(u)(xs) - jnp.sin(xs)
    boundary = u(jnp.zeros(())) ** 2 + (u(jnp.ones(())) - 1.0) ** 2
    return jnp.mean(residual**2) + boundary


def pinn() -> Case:
    xs = jnp.linspace(0.0, 1.0, 12)
    factory = lambda: PINN(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("pinn", factory, _metrics(poisson_residual), (xs,), "grad of grad in the loss")


class Critic(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a = nnx.Linear(6, 24, rngs=rngs)
        self.b = nnx.Linear(24, 24, rngs=rngs)
        self.c = nnx.Linear(24, 1, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.leaky_relu(self.b(jax.nn.leaky_relu(self.a(x), 0.2)), 0.2)
        return self.c(h)[:, 0]


def critic_loss(model, real, fake, eps):
    mixed = eps * real + (1 - eps) * fake
    g = jax.grad(lambda m: model(m).sum())(mixed)
    penalty = jnp.mean((jnp.sqrt(jnp.sum(g**2, -1) + 1e-12) - 1) ** 2)
    return model(fake).mean() - model(real).mean() + 10 * penalty


def wgan_gp() -> Case:
    real = jax.random.normal(_key(601), (10, 6))
    fake = jax.random.normal(_key(602), (10, 6)) + 1
    eps = jax.random.uniform(_key(603), (10, 1))
    factory = lambda: Critic(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("wgan_gp", factory, _metrics(critic_loss), (real, fake, eps),
                 "gradient penalty: grad in the input inside the loss")  # fmt: skip


class Denoiser(nnx.Module):
    def __init__(self, d: int = 8, *, rngs: nnx.Rngs):
        self.t_proj = nnx.Linear(16, 32, rngs=rngs)
        self.inp = nnx.Linear(d, 32, rngs=rngs)
        self.norm = nnx.LayerNorm(32, rngs=rngs)
        self.mid = nnx.Linear(32, 32, rngs=rngs)
        self.out = nnx.Linear(32, d, rngs=rngs)

    def __call__(self, x, t):
        freqs = jnp.exp(-math.log(10000.0) * jnp.arange(8) / 8)
        angles = t[:, None].astype(jnp.float32) * freqs[None]
        emb = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1)
        h = self.inp(x) + jax.nn.silu(self.t_proj(emb))
        h = h + self.mid(jax.nn.silu(self.norm(h)))
        return self.out(h)


ALPHA_BAR = jnp.cumprod(1 - jnp.linspace(1e-4, 0.02, 100))


def ddpm_loss(model, x0, key):
    key_t, key_noise = jax.random.split(key)
    t = jax.random.randint(key_t, (x0.shape[0],), 0, ALPHA_BAR.shape[0])
    noise = jax.random.normal(key_noise, x0.shape)
    a = ALPHA_BAR[t][:, None]
    xt = jnp.sqrt(a) * x0 + jnp.sqrt(1 - a) * noise
    return jnp.mean((model(xt, t) - noise) ** 2)


def diffusion() -> Case:
    x0 = jax.random.normal(_key(604), (16, 8))
    factory = lambda: Denoiser(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("diffusion", factory, _metrics(ddpm_loss), (x0, _key(605)),
                 "timesteps and noise drawn in the loss from a key argument")  # fmt: skip


class STN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.loc = nnx.Linear(64, 6, rngs=rngs)
        self.loc.kernel[...] = 0.01 * self.loc.kernel[...]  # near the identity transform
        self.loc.bias[...] = jnp.array([1.0, 0, 0, 0, 1.0, 0])
        self.cls = nnx.Linear(64, 4, rngs=rngs)

    def __call__(self, x):  # (B, 8, 8)
        b = x.shape[0]
        theta = self.loc(x.reshape(b, -1)).reshape(b, 2, 3)
        axis = jnp.linspace(-1, 1, 8)
        grid = jnp.stack(jnp.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
        grid = jnp.concatenate([grid, jnp.ones((64, 1))], -1)
        coords = (jnp.einsum("bij,pj->bpi", theta, grid) + 1) * 3.5

        def sample(image, c):
            return jax.scipy.ndimage.map_coordinates(image, [c[:, 0], c[:, 1]], order=1,
                                                     mode="nearest")  # fmt: skip

        return self.cls(jax.vmap(sample)(x, coords))


def stn() -> Case:
    x, y = jax.random.normal(_key(606), (3, 8, 8)), jnp.array([0, 2, 3])
    factory = lambda: STN(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("stn", factory, _metrics(classify), (x, y), "map_coordinates sampling")


LOSS_CASES: dict[str, Callable[[], Case]] = {
    "pinn": pinn,
    "wgan_gp": wgan_gp,
    "diffusion": diffusion,
    "stn": stn,
}
