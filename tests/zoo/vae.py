"""A convolutional variational autoencoder (Kingma & Welling) as the Flax NNX VAE examples
write it: a strided-conv encoder to the mean and log-variance of a diagonal Gaussian, the
reparameterisation trick with noise drawn from an RNG stream the model holds
(``self.rngs = nnx.Rngs(noise=...)``, ``jax.random.normal(self.rngs.noise(), ...)``), a
decoder of ``nnx.ConvTranspose`` layers to Bernoulli logits; loss = sigmoid binary
cross-entropy summed over pixels + beta * KL(q(z|x) || N(0, I)), averaged over the batch."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class VAEConfig:
    image_size: int = 16
    channels: int = 1
    hidden: tuple[int, int] = (16, 32)
    latent_dim: int = 8
    beta: float = 1.0


class Encoder(nnx.Module):
    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
        c1, c2 = cfg.hidden
        self.conv1 = nnx.Conv(cfg.channels, c1, (3, 3), strides=(2, 2), rngs=rngs)
        self.conv2 = nnx.Conv(c1, c2, (3, 3), strides=(2, 2), rngs=rngs)
        flat = (cfg.image_size // 4) ** 2 * c2
        self.fc_mean = nnx.Linear(flat, cfg.latent_dim, rngs=rngs)
        self.fc_logvar = nnx.Linear(flat, cfg.latent_dim, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        x = x.reshape(x.shape[0], -1)
        return self.fc_mean(x), self.fc_logvar(x)


class Decoder(nnx.Module):
    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
        c1, c2 = cfg.hidden
        self.side = cfg.image_size // 4
        self.c2 = c2
        self.fc = nnx.Linear(cfg.latent_dim, self.side * self.side * c2, rngs=rngs)
        self.deconv1 = nnx.ConvTranspose(c2, c1, (3, 3), strides=(2, 2), rngs=rngs)
        self.deconv2 = nnx.ConvTranspose(c1, cfg.channels, (3, 3), strides=(2, 2), rngs=rngs)

    def __call__(self, z):
        x = nnx.relu(self.fc(z)).reshape(z.shape[0], self.side, self.side, self.c2)
        x = nnx.relu(self.deconv1(x))
        return self.deconv2(x)  # logits


class VAE(nnx.Module):
    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs, noise_seed: int = 0):
        self.cfg = cfg
        self.encoder = Encoder(cfg, rngs=rngs)
        self.decoder = Decoder(cfg, rngs=rngs)
        self.rngs = nnx.Rngs(noise=noise_seed)

    def reparameterize(self, mean, logvar):
        std = jnp.exp(0.5 * logvar)
        eps = jax.random.normal(self.rngs.noise(), mean.shape)
        return mean + eps * std

    def __call__(self, x):
        mean, logvar = self.encoder(x)
        z = self.reparameterize(mean, logvar)
        return self.decoder(z), mean, logvar


def kl_divergence(mean, logvar):
    return -0.5 * jnp.sum(1 + logvar - jnp.square(mean) - jnp.exp(logvar), axis=-1)


def vae_losses(model, images):
    logits, mean, logvar = model(images)
    bce = optax.sigmoid_binary_cross_entropy(logits, images).sum(axis=(1, 2, 3))
    kld = kl_divergence(mean, logvar)
    return bce.mean(), kld.mean()


def make(seed: int = 0, cfg: VAEConfig | None = None) -> Case:
    cfg = cfg or VAEConfig()
    key = jax.random.key(seed + 1)
    shape = (4, cfg.image_size, cfg.image_size, cfg.channels)
    images = (jax.random.uniform(key, shape) > 0.5).astype(jnp.float32)  # binarised pixels

    def loss_fn(model, images):
        bce, kld = vae_losses(model, images)
        return bce + cfg.beta * kld

    def aux_loss_fn(model, images):
        bce, kld = vae_losses(model, images)
        loss = bce + cfg.beta * kld
        return loss, {"loss": loss, "bce": bce, "kld": kld}

    return Case(
        name="vae",
        factory=lambda: VAE(cfg, rngs=nnx.Rngs(seed), noise_seed=seed + 7),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(images,),
        notes="strided-conv encoder to mean/log-variance, reparameterisation with noise from "
        "an nnx.Rngs stream held by the model (RngCount mutated), nnx.ConvTranspose decoder, "
        "sigmoid BCE + KL, tuple model output",
    )
