"""Small Flax NNX example models, built as lists of stages (one array in, one out):
what ``schedir profile`` profiles, and what the examples, benchmarks and tests build.
Part of the command line (an application), not of the library: ``jax_exec`` never
imports it.

Two families with different memory profiles:

- :func:`mlp_stack`: an input projection, residual MLP blocks (LayerNorm, Linear to a
  wider hidden layer, GELU, Linear back, residual add), and an output head;
- :func:`transformer_stack`: a token embedding, pre-norm transformer blocks
  (multi-head self-attention and an MLP, both residual) and a mean-pooled head.

Each returns a plain list of modules; ``nnx.Sequential(*layers)`` gives the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class MLPBlock(nnx.Module):
    """``x + W2 gelu(W1 LayerNorm(x))`` with hidden width ``hidden``."""

    def __init__(self, width: int, hidden: int, *, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.down(jax.nn.gelu(self.up(self.norm(x))))


class Attention(nnx.Module):
    """Multi-head self-attention over axis -2 of ``(batch, tokens, dim)``."""

    def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs) -> None:
        if dim % heads:
            raise ValueError(f"dim = {dim} is not a multiple of heads = {heads}")
        self.heads = heads
        self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
        self.out = nnx.Linear(dim, dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3 * self.heads, d // self.heads), 3, 2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(d // self.heads)
        mixed = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
        return self.out(mixed.reshape(b, t, d))


class TransformerBlock(nnx.Module):
    """Pre-norm block: ``x + attn(LN(x))`` then ``x + mlp(LN(x))``."""

    def __init__(self, dim: int, heads: int, hidden: int, *, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.attn = Attention(dim, heads, rngs=rngs)
        self.mlp = MLPBlock(dim, hidden, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.mlp(x + self.attn(self.norm(x)))


class MeanHead(nnx.Module):
    """Mean over tokens, then a linear map: ``(batch, tokens, dim) -> (batch, out)``."""

    def __init__(self, dim: int, out: int, *, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.proj = nnx.Linear(dim, out, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(self.norm(x).mean(axis=-2))


def mlp_stack(
    depth: int, width: int, hidden: int, in_dim: int, out_dim: int, *, seed: int = 0
) -> list[nnx.Module]:
    """``depth`` residual MLP blocks between an input projection and a head (depth + 2 stages)."""
    rngs = nnx.Rngs(seed)
    layers: list[nnx.Module] = [nnx.Linear(in_dim, width, rngs=rngs)]
    layers += [MLPBlock(width, hidden, rngs=rngs) for _ in range(depth)]
    layers.append(nnx.Linear(width, out_dim, rngs=rngs))
    return layers


def transformer_stack(
    depth: int, dim: int, heads: int, hidden: int, in_dim: int, out_dim: int, *, seed: int = 0
) -> list[nnx.Module]:
    """Token embedding, ``depth`` transformer blocks and a mean-pooled head (depth + 2 stages).

    Input ``(batch, tokens, in_dim)``, output ``(batch, out_dim)``.
    """
    rngs = nnx.Rngs(seed)
    layers: list[nnx.Module] = [nnx.Linear(in_dim, dim, rngs=rngs)]
    layers += [TransformerBlock(dim, heads, hidden, rngs=rngs) for _ in range(depth)]
    layers.append(MeanHead(dim, out_dim, rngs=rngs))
    return layers


def mse_loss(out: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error, a scalar."""
    return jnp.mean((out - y) ** 2)


# DAG models (docs/graphs.md): a dict name -> (module, [input names]).


class Add(nnx.Module):
    """``a + b`` (no parameters): a skip connection."""

    def __call__(self, a: jax.Array, b: jax.Array) -> jax.Array:
        return a + b


class Concat(nnx.Module):
    """Concatenation on the last axis (no parameters): a U-Net style merge."""

    def __call__(self, *xs: jax.Array) -> jax.Array:
        return jnp.concatenate(xs, axis=-1)


class Block(nnx.Module):
    """``W2 gelu(W1 LayerNorm(x))``: an MLP block without its own skip connection."""

    def __init__(self, width: int, hidden: int, out: int | None = None, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, out or width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(self.norm(x))))


def residual_dag(
    depth: int, width: int, hidden: int, in_dim: int, out_dim: int, *, seed: int = 0
) -> dict[str, tuple[nnx.Module, list[str]]]:
    """A residual MLP as a DAG, with a U-Net style long skip (model input ``"x"``).

    ``embed`` = Linear(x); then per block i: ``block{i}`` = Block(h), ``add{i}`` =
    h + block{i} (h: the previous add, or embed); then ``cat`` = [h, embed] (the long
    skip from the embedding) and ``head`` = Linear(cat). Embed has three readers, the
    adds two: their gradients are accumulated from several backward nodes.
    """
    rngs = nnx.Rngs(seed)
    nodes: dict[str, tuple[nnx.Module, list[str]]] = {
        "embed": (nnx.Linear(in_dim, width, rngs=rngs), ["x"])
    }
    h = "embed"
    for i in range(depth):
        nodes[f"block{i}"] = (Block(width, hidden, rngs=rngs), [h])
        nodes[f"add{i}"] = (Add(), [h, f"block{i}"])
        h = f"add{i}"
    nodes["cat"] = (Concat(), [h, "embed"])
    nodes["head"] = (nnx.Linear(2 * width, out_dim, rngs=rngs), ["cat"])
    return nodes
