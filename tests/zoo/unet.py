"""A diffusion U-Net (Ho et al., DDPM) as Flax NNX reimplementations write it: a sinusoidal
timestep embedding and its MLP, residual blocks (``nnx.GroupNorm``, SiLU, 3x3 convs, the time
embedding added per channel, dropout, a 1x1 skip when the width changes), a self-attention
block at the lowest resolution, downsampling by strided convs, upsampling by
``jax.image.resize`` (nearest) + conv, skip connections kept in a Python list and
concatenated across levels; the loss noises the image with a cosine schedule at timesteps
``t`` (an argument) and is the MSE between the predicted and the true noise."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from flax import nnx

from . import Case


@dataclass
class UNetConfig:
    in_channels: int = 3
    base_channels: int = 16
    channel_mults: list[int] = field(default_factory=lambda: [1, 2])
    time_dim: int = 32
    groups: int = 4
    dropout: float = 0.1
    num_timesteps: int = 1000


def timestep_embedding(t, dim: int, max_period: float = 10000.0):
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


class ResBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, cfg: UNetConfig, *, rngs: nnx.Rngs):
        self.norm1 = nnx.GroupNorm(cin, num_groups=cfg.groups, rngs=rngs)
        self.conv1 = nnx.Conv(cin, cout, (3, 3), rngs=rngs)
        self.time_proj = nnx.Linear(cfg.time_dim, cout, rngs=rngs)
        self.norm2 = nnx.GroupNorm(cout, num_groups=cfg.groups, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), rngs=rngs)
        self.nin_shortcut = nnx.Linear(cin, cout, rngs=rngs) if cin != cout else None  # 1x1

    def __call__(self, x, temb):
        h = self.conv1(nnx.silu(self.norm1(x)))
        h = h + self.time_proj(nnx.silu(temb))[:, None, None, :]
        h = self.conv2(self.dropout(nnx.silu(self.norm2(h))))
        return h + (self.nin_shortcut(x) if self.nin_shortcut is not None else x)


class AttnBlock(nnx.Module):
    def __init__(self, channels: int, groups: int, *, rngs: nnx.Rngs):
        self.norm = nnx.GroupNorm(channels, num_groups=groups, rngs=rngs)
        self.qkv = nnx.Linear(channels, 3 * channels, rngs=rngs)
        self.proj = nnx.Linear(channels, channels, rngs=rngs)

    def __call__(self, x):
        b, h, w, c = x.shape
        q, k, v = jnp.split(self.qkv(self.norm(x)).reshape(b, h * w, 3 * c), 3, axis=-1)
        attn = jax.nn.softmax(jnp.einsum("bic,bjc->bij", q, k) / math.sqrt(c), axis=-1)
        out = jnp.einsum("bij,bjc->bic", attn, v).reshape(b, h, w, c)
        return x + self.proj(out)


class UNet(nnx.Module):
    def __init__(self, cfg: UNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        ch = [cfg.base_channels * m for m in cfg.channel_mults]
        self.time_mlp1 = nnx.Linear(cfg.base_channels, cfg.time_dim, rngs=rngs)
        self.time_mlp2 = nnx.Linear(cfg.time_dim, cfg.time_dim, rngs=rngs)
        self.conv_in = nnx.Conv(cfg.in_channels, ch[0], (3, 3), rngs=rngs)
        down, downsample, cin = [], [], ch[0]
        for i, c in enumerate(ch):
            down.append(ResBlock(cin, c, cfg, rngs=rngs))
            cin = c
            if i < len(ch) - 1:
                downsample.append(nnx.Conv(c, c, (3, 3), strides=(2, 2), rngs=rngs))
        self.down = nnx.List(down)
        self.downsample = nnx.List(downsample)
        self.mid_attn = AttnBlock(cin, cfg.groups, rngs=rngs)
        up, upsample = [], []
        for i, c in reversed(list(enumerate(ch))):
            up.append(ResBlock(cin + c, c, cfg, rngs=rngs))  # concatenated skip of level i
            cin = c
            if i > 0:
                upsample.append(nnx.Conv(c, ch[i - 1], (3, 3), rngs=rngs))
                cin = ch[i - 1]
        self.up = nnx.List(up)
        self.upsample = nnx.List(upsample)
        self.norm_out = nnx.GroupNorm(cin, num_groups=cfg.groups, rngs=rngs)
        self.conv_out = nnx.Conv(cin, cfg.in_channels, (3, 3), rngs=rngs)

    def __call__(self, x, t):
        temb = timestep_embedding(t, self.cfg.base_channels)
        temb = self.time_mlp2(nnx.silu(self.time_mlp1(temb)))
        h = self.conv_in(x)
        hs = []
        for i, block in enumerate(self.down):
            h = block(h, temb)
            hs.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
        h = self.mid_attn(h)
        for i, block in enumerate(self.up):
            h = block(jnp.concatenate([h, hs.pop()], axis=-1), temb)
            if i < len(self.upsample):
                b, hh, ww, c = h.shape
                h = jax.image.resize(h, (b, 2 * hh, 2 * ww, c), method="nearest")
                h = self.upsample[i](h)
        return self.conv_out(nnx.silu(self.norm_out(h)))


def cosine_alpha_bar(t, num_timesteps: int, s: float = 0.008):
    f = (t.astype(jnp.float32) / num_timesteps + s) / (1 + s)
    return jnp.cos(f * jnp.pi / 2) ** 2


def make(seed: int = 0, cfg: UNetConfig | None = None) -> Case:
    cfg = cfg or UNetConfig()
    key = jax.random.key(seed + 1)
    x0 = jax.random.uniform(key, (2, 8, 8, cfg.in_channels), minval=-1.0, maxval=1.0)
    noise = jax.random.normal(jax.random.fold_in(key, 1), x0.shape)
    t = jax.random.randint(jax.random.fold_in(key, 2), (2,), 0, cfg.num_timesteps)

    def loss_fn(model, x0, noise, t):
        abar = cosine_alpha_bar(t, cfg.num_timesteps)[:, None, None, None]
        x_t = jnp.sqrt(abar) * x0 + jnp.sqrt(1.0 - abar) * noise
        return jnp.mean((model(x_t, t) - noise) ** 2)

    def aux_loss_fn(model, x0, noise, t):
        abar = cosine_alpha_bar(t, cfg.num_timesteps)[:, None, None, None]
        x_t = jnp.sqrt(abar) * x0 + jnp.sqrt(1.0 - abar) * noise
        pred = model(x_t, t)
        loss = jnp.mean((pred - noise) ** 2)
        x0_pred = (x_t - jnp.sqrt(1.0 - abar) * pred) / jnp.sqrt(abar)
        return loss, {"loss": loss, "x0_mse": jnp.mean((x0_pred - x0) ** 2)}

    return Case(
        name="unet",
        factory=lambda: UNet(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(x0, noise, t),
        notes="sinusoidal timestep embedding + MLP, GroupNorm res blocks with time "
        "conditioning and dropout, mid self-attention, strided-conv downsampling, "
        "jax.image.resize upsampling, skip concatenations popped from a list, cosine "
        "noise schedule, epsilon-prediction MSE",
    )
