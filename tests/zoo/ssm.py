"""A Mamba-style selective state-space language model (simplified, after the public Mamba
ports to JAX/Flax): per block an input projection to two branches, a depthwise causal
conv1d (``nnx.Conv`` with ``feature_group_count`` and left padding), a selective diagonal
recurrence (input-dependent ``delta``, ``B``, ``C``; ``A = -exp(A_log)``) run over time with
``jax.lax.scan`` or ``jax.lax.associative_scan`` (``cfg.scan_modes``, one per layer, a plain
list held by the model), a SiLU gate, a skip ``D``, pre-RMSNorm residual blocks, tied
embeddings."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class MambaConfig:
    vocab_size: int = 64
    d_model: int = 32
    d_state: int = 8
    expand: int = 2
    d_conv: int = 4
    dt_rank: int = 4
    scan_modes: list[str] = field(default_factory=lambda: ["sequential", "associative"])

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        self.weight = nnx.Param(jnp.ones((dim,)))
        self.eps = eps

    def __call__(self, x):
        return x * jax.lax.rsqrt(jnp.mean(x**2, -1, keepdims=True) + self.eps) * self.weight[...]


def selective_scan_sequential(u, delta, A, B, C):
    """h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t;  y_t = C_t . h_t  (scan over time)."""
    dA = jnp.exp(jnp.einsum("bld,dn->bldn", delta, A))
    dBu = jnp.einsum("bld,bln,bld->bldn", delta, B, u)

    def step(h, inputs):
        dA_t, dBu_t, C_t = inputs
        h = dA_t * h + dBu_t
        return h, jnp.einsum("bdn,bn->bd", h, C_t)

    h0 = jnp.zeros((u.shape[0], u.shape[2], A.shape[1]), u.dtype)
    xs = (jnp.swapaxes(dA, 0, 1), jnp.swapaxes(dBu, 0, 1), jnp.swapaxes(C, 0, 1))
    _, ys = jax.lax.scan(step, h0, xs)
    return jnp.swapaxes(ys, 0, 1)


def selective_scan_associative(u, delta, A, B, C):
    """The same recurrence as a parallel prefix scan over (decay, input) pairs."""
    dA = jnp.exp(jnp.einsum("bld,dn->bldn", delta, A))
    dBu = jnp.einsum("bld,bln,bld->bldn", delta, B, u)

    def combine(left, right):
        a_l, b_l = left
        a_r, b_r = right
        return a_l * a_r, a_r * b_l + b_r

    _, h = jax.lax.associative_scan(combine, (dA, dBu), axis=1)
    return jnp.einsum("bldn,bln->bld", h, C)


class MambaBlock(nnx.Module):
    def __init__(self, cfg: MambaConfig, scan_mode: str, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.scan_mode = scan_mode
        di = cfg.d_inner
        self.in_proj = nnx.Linear(cfg.d_model, 2 * di, use_bias=False, rngs=rngs)
        self.conv1d = nnx.Conv(
            di,
            di,
            kernel_size=(cfg.d_conv,),
            feature_group_count=di,
            padding=[(cfg.d_conv - 1, 0)],
            rngs=rngs,
        )
        self.x_proj = nnx.Linear(di, cfg.dt_rank + 2 * cfg.d_state, use_bias=False, rngs=rngs)
        self.dt_proj = nnx.Linear(cfg.dt_rank, di, rngs=rngs)
        A = jnp.tile(jnp.arange(1, cfg.d_state + 1, dtype=jnp.float32)[None], (di, 1))
        self.A_log = nnx.Param(jnp.log(A))
        self.D = nnx.Param(jnp.ones((di,)))
        self.out_proj = nnx.Linear(di, cfg.d_model, use_bias=False, rngs=rngs)

    def __call__(self, x):
        cfg = self.cfg
        x, z = jnp.split(self.in_proj(x), 2, axis=-1)
        x = jax.nn.silu(self.conv1d(x))
        dt, B, C = jnp.split(self.x_proj(x), [cfg.dt_rank, cfg.dt_rank + cfg.d_state], axis=-1)
        delta = jax.nn.softplus(self.dt_proj(dt))
        A = -jnp.exp(self.A_log[...])
        scan = (
            selective_scan_sequential
            if self.scan_mode == "sequential"
            else (selective_scan_associative)
        )
        y = scan(x, delta, A, B, C) + x * self.D[...]
        y = y * jax.nn.silu(z)
        return self.out_proj(y)


class ResidualBlock(nnx.Module):
    def __init__(self, cfg: MambaConfig, scan_mode: str, *, rngs: nnx.Rngs):
        self.norm = RMSNorm(cfg.d_model)
        self.mixer = MambaBlock(cfg, scan_mode, rngs=rngs)

    def __call__(self, x):
        return x + self.mixer(self.norm(x))


class Mamba(nnx.Module):
    def __init__(self, cfg: MambaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.scan_modes = list(cfg.scan_modes)  # plain list attribute
        self.embedding = nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
        self.layers = nnx.List([ResidualBlock(cfg, m, rngs=rngs) for m in self.scan_modes])
        self.norm_f = RMSNorm(cfg.d_model)

    def __call__(self, tokens):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.embedding.attend(self.norm_f(x))


def make(seed: int = 0, cfg: MambaConfig | None = None) -> Case:
    cfg = cfg or MambaConfig()
    seq = jax.random.randint(jax.random.key(seed + 1), (2, 13), 0, cfg.vocab_size)
    tokens, labels = seq[:, :-1], seq[:, 1:]

    def loss_fn(model, tokens, labels):
        logits = model(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, tokens, labels):
        logits = model(tokens)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        perplexity = jnp.exp(loss)
        return loss, {"loss": loss, "perplexity": perplexity}

    return Case(
        name="ssm",
        factory=lambda: Mamba(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(tokens, labels),
        notes="selective SSM: depthwise causal conv1d, lax.scan recurrence (layer 0) and "
        "lax.associative_scan (layer 1), softplus delta, SiLU gating, RMSNorm, plain list "
        "attribute, tied embeddings",
    )
