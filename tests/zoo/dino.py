"""DINO self-distillation (Caron et al.) as Flax NNX reimplementations write it: a student
and a teacher, each a small ViT backbone (timm-style fused ``qkv`` attention written by hand)
and a DINO head (MLP, L2-normalised bottleneck, weight-normalised last layer with a learnable
gain ``g``); the teacher's outputs go through ``jax.lax.stop_gradient`` and are centred by a
running ``center`` (a non-parameter ``nnx.Variable`` updated by EMA inside the loss) and
sharpened by a lower fixed temperature; the student's temperature is learnable
(``log_temp``). Two augmented views (the image and a flipped, noised copy) are arguments;
the loss is the cross-entropy between the teacher's and the student's softmaxed outputs of
different views."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from . import Case


@dataclass
class DINOConfig:
    image_size: int = 8
    patch_size: int = 2
    in_chans: int = 3
    embed_dim: int = 32
    depth: int = 1
    num_heads: int = 4
    mlp_ratio: int = 2
    head_hidden: int = 64
    bottleneck: int = 16
    out_dim: int = 32
    teacher_temp: float = 0.04
    student_temp: float = 0.1
    center_momentum: float = 0.9
    drop_rate: float = 0.1


class Attention(nnx.Module):
    def __init__(self, dim: int, num_heads: int, drop: float, *, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, rngs=rngs)
        self.attn_drop = nnx.Dropout(drop, rngs=rngs)

    def __call__(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)
        q, k, v = jnp.transpose(qkv, (2, 0, 3, 1, 4))  # each (b, h, n, d)
        attn = jax.nn.softmax((q @ jnp.swapaxes(k, -2, -1)) * self.scale, axis=-1)
        x = jnp.swapaxes(self.attn_drop(attn) @ v, 1, 2).reshape(b, n, c)
        return self.proj(x)


class Block(nnx.Module):
    def __init__(self, cfg: DINOConfig, *, rngs: nnx.Rngs):
        d = cfg.embed_dim
        self.norm1 = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)
        self.attn = Attention(d, cfg.num_heads, cfg.drop_rate, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)
        self.fc1 = nnx.Linear(d, cfg.mlp_ratio * d, rngs=rngs)
        self.fc2 = nnx.Linear(cfg.mlp_ratio * d, d, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(nnx.gelu(self.fc1(self.norm2(x))))


class VisionTransformer(nnx.Module):
    def __init__(self, cfg: DINOConfig, *, rngs: nnx.Rngs):
        p, d = cfg.patch_size, cfg.embed_dim
        n = (cfg.image_size // p) ** 2
        self.patch_embed = nnx.Conv(cfg.in_chans, d, (p, p), strides=(p, p), rngs=rngs)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, d)))
        self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, n + 1, d)))
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.depth)])
        self.norm = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)

    def __call__(self, x):
        x = self.patch_embed(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        cls = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[-1]))
        x = jnp.concatenate([cls, x], axis=1) + self.pos_embed[...]
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]


class DINOHead(nnx.Module):
    def __init__(self, cfg: DINOConfig, *, rngs: nnx.Rngs):
        self.mlp1 = nnx.Linear(cfg.embed_dim, cfg.head_hidden, rngs=rngs)
        self.mlp2 = nnx.Linear(cfg.head_hidden, cfg.bottleneck, rngs=rngs)
        init = jax.nn.initializers.truncated_normal(0.02)
        self.last_v = nnx.Param(init(rngs.params(), (cfg.bottleneck, cfg.out_dim)))
        self.last_g = nnx.Param(jnp.ones((cfg.out_dim,)))

    def __call__(self, x):
        x = self.mlp2(nnx.gelu(self.mlp1(x)))
        x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
        v = self.last_v[...]
        w = self.last_g[...] * v / jnp.linalg.norm(v, axis=0, keepdims=True)  # weight norm
        return x @ w


class MultiCropWrapper(nnx.Module):
    def __init__(self, cfg: DINOConfig, *, rngs: nnx.Rngs):
        self.backbone = VisionTransformer(cfg, rngs=rngs)
        self.head = DINOHead(cfg, rngs=rngs)

    def __call__(self, views):
        x = jnp.concatenate(views, axis=0)  # all views in one batch, as DINO does
        return jnp.split(self.head(self.backbone(x)), len(views), axis=0)


class Center(nnx.Variable):
    pass


class DINO(nnx.Module):
    def __init__(self, cfg: DINOConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.student = MultiCropWrapper(cfg, rngs=rngs)
        self.teacher = MultiCropWrapper(cfg, rngs=rngs)
        self.center = Center(jnp.zeros((1, cfg.out_dim)))
        self.log_temp = nnx.Param(jnp.log(jnp.asarray(cfg.student_temp)))

    def __call__(self, view1, view2):
        s_out = self.student((view1, view2))
        t_out = [jax.lax.stop_gradient(t) for t in self.teacher((view1, view2))]
        return s_out, t_out


def dino_loss(model: DINO, s_out, t_out):
    cfg = model.cfg
    center = model.center[...]
    temp = jnp.exp(model.log_temp[...])
    t_probs = [jax.nn.softmax((t - center) / cfg.teacher_temp, axis=-1) for t in t_out]
    s_logp = [jax.nn.log_softmax(s / temp, axis=-1) for s in s_out]
    total, n = 0.0, 0
    for i, tp in enumerate(t_probs):
        for j, sl in enumerate(s_logp):
            if i != j:
                total = total + jnp.mean(jnp.sum(-tp * sl, axis=-1))
                n += 1
    batch_center = jnp.mean(jnp.concatenate(t_out, axis=0), axis=0, keepdims=True)
    m = cfg.center_momentum
    model.center[...] = center * m + batch_center * (1 - m)  # EMA update, in the loss
    return total / n, t_probs


def make(seed: int = 0, cfg: DINOConfig | None = None) -> Case:
    cfg = cfg or DINOConfig()
    key = jax.random.key(seed + 1)
    view1 = jax.random.normal(key, (2, cfg.image_size, cfg.image_size, cfg.in_chans))
    noise = 0.1 * jax.random.normal(jax.random.fold_in(key, 1), view1.shape)
    view2 = jnp.flip(view1, axis=2) + noise

    def loss_fn(model, view1, view2):
        s_out, t_out = model(view1, view2)
        loss, _ = dino_loss(model, s_out, t_out)
        return loss

    def aux_loss_fn(model, view1, view2):
        s_out, t_out = model(view1, view2)
        loss, t_probs = dino_loss(model, s_out, t_out)
        entropy = -jnp.mean(jnp.sum(t_probs[0] * jnp.log(t_probs[0] + 1e-8), axis=-1))
        return loss, {"loss": loss, "teacher_entropy": entropy}

    return Case(
        name="dino",
        factory=lambda: DINO(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(view1, view2),
        notes="student/teacher ViTs (fused qkv), teacher under stop_gradient, views batched "
        "by concatenate then split, weight-normalised head, centering Variable updated by EMA "
        "inside the loss, learnable student temperature, cross-view cross-entropy",
    )
