"""A GPT-2-style causal LM whose layers are stacked and scanned, the Flax NNX "scan over
layers" pattern: the block stack is created once by an ``nnx.vmap``-ed constructor under
``@nnx.split_rngs(splits=n_layers)`` (one parameter and dropout-key slice per layer), and
applied with ``nnx.scan`` over the stack, with ``nnx.remat`` on the layer function inside the
scan (the usual memory pattern); each layer's dropout streams are its slice of the stack.
Blocks: pre-LayerNorm, ``nnx.MultiHeadAttention`` with a causal mask from
``nnx.make_causal_mask``, GELU MLP, dropout; learned positions, untied LM head."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    dropout: float = 0.1


class Block(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        d = cfg.n_embd
        self.ln_1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=cfg.n_head,
            in_features=d,
            dropout_rate=cfg.dropout,
            deterministic=False,
            decode=False,
            rngs=rngs,
        )
        self.ln_2 = nnx.LayerNorm(d, rngs=rngs)
        self.c_fc = nnx.Linear(d, 4 * d, rngs=rngs)
        self.c_proj = nnx.Linear(4 * d, d, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.dropout(self.attn(self.ln_1(x), mask=mask))
        return x + self.dropout(self.c_proj(nnx.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.wte = nnx.Embed(cfg.vocab_size, cfg.n_embd, rngs=rngs)
        self.wpe = nnx.Embed(cfg.block_size, cfg.n_embd, rngs=rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

        @nnx.split_rngs(splits=cfg.n_layer)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create_blocks(rngs: nnx.Rngs):
            return Block(cfg, rngs=rngs)

        self.h = create_blocks(rngs)
        self.ln_f = nnx.LayerNorm(cfg.n_embd, rngs=rngs)
        self.lm_head = nnx.Linear(cfg.n_embd, cfg.vocab_size, use_bias=False, rngs=rngs)

    def __call__(self, idx):
        b, t = idx.shape
        pos = jnp.arange(t)[None]
        x = self.drop(self.wte(idx) + self.wpe(pos))
        mask = nnx.make_causal_mask(idx)

        @nnx.scan(in_axes=(nnx.Carry, 0, None), out_axes=nnx.Carry)
        @nnx.remat
        def forward(x, block: Block, mask):
            return block(x, mask)

        x = forward(x, self.h, mask)
        return self.lm_head(self.ln_f(x))


def make(seed: int = 0, cfg: GPTConfig | None = None) -> Case:
    cfg = cfg or GPTConfig()
    seq = jax.random.randint(jax.random.key(seed + 1), (2, cfg.block_size + 1), 0, cfg.vocab_size)
    idx, targets = seq[:, :-1], seq[:, 1:]

    def loss_fn(model, idx, targets):
        logits = model(idx)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def aux_loss_fn(model, idx, targets):
        logits = model(idx)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == targets)}

    return Case(
        name="scan_lm",
        factory=lambda: GPT(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(idx, targets),
        notes="layer stack created by nnx.split_rngs + nnx.vmap, applied by nnx.scan with "
        "nnx.remat inside, per-layer dropout streams (RngCount updated in the scan), "
        "nnx.MultiHeadAttention with make_causal_mask, learned positions",
    )
