"""Small Flax NNX models for the automatic planner's tests (written for the tests only).

- :class:`MLP`: a residual MLP (the simplest case);
- :class:`GPT`: token and position embeddings, pre-norm causal attention blocks with
  dropout, and the embedding matrix reused as the output projection (tied weights);
  integer tokens in, cross-entropy against integer targets;
- :class:`ResNet`: convolutions with BatchNorm in training mode and residual blocks,
  a strided downsampling stage, global pooling;
- :class:`UNet`: an encoder-decoder whose decoder concatenates the encoder's feature
  maps (skip connections across many blocks);
- :class:`ScanStack`: identical MLP blocks stacked with ``nnx.scan``.

Each ``make_*`` returns ``(model_factory, loss_fn, args)``; the factory builds the same
model (same parameters, same RNG state) every call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, width: int, depth: int, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(8, width, rngs=rngs)

        def block():
            return nnx.Sequential(
                nnx.LayerNorm(width, rngs=rngs),
                nnx.Linear(width, 2 * width, rngs=rngs),
                jax.nn.gelu,
                nnx.Linear(2 * width, width, rngs=rngs),
            )

        self.blocks = nnx.List([block() for _ in range(depth)])
        self.out = nnx.Linear(width, 4, rngs=rngs)

    def __call__(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def mse(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def make_mlp(width: int = 16, depth: int = 3, batch: int = 8):
    x = jax.random.normal(jax.random.key(1), (batch, 8))
    y = jax.random.normal(jax.random.key(2), (batch, 4))
    return (lambda: MLP(width, depth, rngs=nnx.Rngs(0))), mse, (x, y)


class Attention(nnx.Module):
    def __init__(self, dim: int, heads: int, dropout: float, *, rngs: nnx.Rngs):
        self.heads = heads
        self.qkv = nnx.Linear(dim, 3 * dim, use_bias=False, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.reshape(shape) for z in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // self.heads)
        mask = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(mask, scores, -1e9)
        weights = self.drop(jax.nn.softmax(scores, axis=-1))
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.proj(out)


class Block(nnx.Module):
    def __init__(self, dim: int, heads: int, dropout: float, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attn = Attention(dim, heads, dropout, rngs=rngs)
        self.ln2 = nnx.LayerNorm(dim, rngs=rngs)
        self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.down = nnx.Linear(4 * dim, dim, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.down(jax.nn.gelu(self.up(self.ln2(x)))))


class GPT(nnx.Module):
    def __init__(self, vocab: int, dim: int, heads: int, depth: int, length: int,
                 dropout: float = 0.1, *, rngs: nnx.Rngs):  # fmt: skip
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (length, dim)))
        self.blocks = nnx.List([Block(dim, heads, dropout, rngs=rngs) for _ in range(depth)])
        self.ln = nnx.LayerNorm(dim, rngs=rngs)

    def __call__(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.embed.attend(self.ln(h))  # tied: the embedding is the output layer


def cross_entropy(model, tokens, targets):
    logits = model(tokens)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def make_gpt(vocab=64, dim=32, heads=4, depth=2, length=16, batch=4, dropout=0.1):
    tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, vocab)
    targets = jnp.roll(tokens, -1, axis=1)

    def factory():
        return GPT(vocab, dim, heads, depth, length, dropout, rngs=nnx.Rngs(0, dropout=7))

    return factory, cross_entropy, (tokens, targets)


class ResBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=stride, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(cout, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(cout, rngs=rngs)
        self.skip = (
            nnx.Conv(cin, cout, (1, 1), strides=stride, use_bias=False, rngs=rngs)
            if stride != 1 or cin != cout
            else None
        )

    def __call__(self, x):
        h = jax.nn.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return jax.nn.relu(h + (x if self.skip is None else self.skip(x)))


class ResNet(nnx.Module):
    def __init__(self, width: int = 8, classes: int = 10, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, width, (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(width, rngs=rngs)
        self.blocks = nnx.List([
            ResBlock(width, width, 1, rngs=rngs),
            ResBlock(width, 2 * width, 2, rngs=rngs),
            ResBlock(2 * width, 2 * width, 1, rngs=rngs),
        ])  # fmt: skip
        self.head = nnx.Linear(2 * width, classes, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.bn(self.stem(x)))
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(axis=(1, 2)))


def classify(model, x, labels):
    logp = jax.nn.log_softmax(model(x))
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def make_resnet(width=8, batch=4, size=16):
    x = jax.random.normal(jax.random.key(1), (batch, size, size, 3))
    labels = jax.random.randint(jax.random.key(2), (batch,), 0, 10)
    return (lambda: ResNet(width, rngs=nnx.Rngs(0))), classify, (x, labels)


class UNet(nnx.Module):
    def __init__(self, width: int = 8, levels: int = 3, *, rngs: nnx.Rngs):
        chans = [width * 2**i for i in range(levels)]
        self.inp = nnx.Conv(1, chans[0], (3, 3), rngs=rngs)
        self.down = nnx.List(
            [nnx.Conv(chans[i], chans[i + 1], (3, 3), strides=2, rngs=rngs)
             for i in range(levels - 1)]
        )  # fmt: skip
        self.mid = nnx.Conv(chans[-1], chans[-1], (3, 3), rngs=rngs)
        self.up = nnx.List(
            [nnx.ConvTranspose(chans[i + 1], chans[i], (2, 2), strides=2, rngs=rngs)
             for i in reversed(range(levels - 1))]
        )  # fmt: skip
        self.merge = nnx.List(
            [
                nnx.Conv(2 * chans[i], chans[i], (3, 3), rngs=rngs)
                for i in reversed(range(levels - 1))
            ]
        )
        self.out = nnx.Conv(chans[0], 1, (1, 1), rngs=rngs)

    def __call__(self, x):
        h = jax.nn.silu(self.inp(x))
        skips = []
        for down in self.down:
            skips.append(h)
            h = jax.nn.silu(down(h))
        h = jax.nn.silu(self.mid(h))
        for up, merge, skip in zip(self.up, self.merge, reversed(skips), strict=True):
            h = jax.nn.silu(up(h))
            h = jax.nn.silu(merge(jnp.concatenate([h, skip], axis=-1)))
        return self.out(h)


def make_unet(width=8, levels=3, batch=2, size=16):
    x = jax.random.normal(jax.random.key(1), (batch, size, size, 1))
    y = jax.random.normal(jax.random.key(2), (batch, size, size, 1))
    return (lambda: UNet(width, levels, rngs=nnx.Rngs(0))), mse, (x, y)


class ScanBlock(nnx.Module):
    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.ln = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 2 * width, rngs=rngs)
        self.down = nnx.Linear(2 * width, width, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.tanh(self.up(self.ln(x))))


class ScanStack(nnx.Module):
    def __init__(self, width: int, depth: int, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(8, width, rngs=rngs)

        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs):
            return ScanBlock(width, rngs=rngs)

        self.stack = create(rngs)
        self.out = nnx.Linear(width, 4, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def body(block, h):
            return block(h)

        return self.out(body(self.stack, self.inp(x)))


def make_scan(width=16, depth=6, batch=8):
    x = jax.random.normal(jax.random.key(1), (batch, 8))
    y = jax.random.normal(jax.random.key(2), (batch, 4))
    return (lambda: ScanStack(width, depth, rngs=nnx.Rngs(0))), mse, (x, y)
