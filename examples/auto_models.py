"""Example Flax NNX models for the automatic planner (examples, benchmarks, experiments).

``MODELS[name](quick=False)`` returns ``(factory, loss_fn, args)``: ``factory()`` builds
the model (same parameters and RNG state every call), ``loss_fn(model, *args)`` is the
training loss.

- ``gpt``: a GPT-style language model: token embedding reused as the output layer
  (tied), learned positions, pre-norm blocks with causal multi-head attention (separate
  query, key and value projections) and a GELU MLP, dropout everywhere;
- ``resnet``: a ResNet for 32x32 images with BatchNorm (training mode), three stages
  (three basic blocks each: ResNet-20's shape; one with ``quick``);
- ``unet``: a U-Net (two convolutions per level) whose decoder concatenates the
  encoder's feature maps;
- ``scanned``: a transformer whose blocks are stacked with ``nnx.scan``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def _token_loss(model, tokens, targets):
    logits = model(tokens)
    return optax_like_xent(logits, targets)


def optax_like_xent(logits, labels):
    """Mean softmax cross-entropy with integer labels."""
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


class CausalSelfAttention(nnx.Module):
    def __init__(self, dim, heads, dropout, rngs):
        self.heads = heads
        self.query = nnx.Linear(dim, dim, rngs=rngs)
        self.key = nnx.Linear(dim, dim, rngs=rngs)
        self.value = nnx.Linear(dim, dim, rngs=rngs)
        self.out = nnx.Linear(dim, dim, rngs=rngs)
        self.attn_drop = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(z):
            return z.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        logits = q @ k.transpose(0, 1, 3, 2) * (d // h) ** -0.5
        causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
        logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
        probs = self.attn_drop(jax.nn.softmax(logits, axis=-1))
        return self.out((probs @ v).transpose(0, 2, 1, 3).reshape(b, t, d))


class TransformerBlock(nnx.Module):
    def __init__(self, dim, heads, dropout, rngs):
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attn = CausalSelfAttention(dim, heads, dropout, rngs)
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.fc1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.fc2 = nnx.Linear(4 * dim, dim, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.fc2(jax.nn.gelu(self.fc1(self.norm2(x)))))


class GPT(nnx.Module):
    def __init__(self, vocab, dim, heads, depth, context, dropout, rngs):
        self.tokens = nnx.Embed(vocab, dim, rngs=rngs)
        self.positions = nnx.Embed(context, dim, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        self.layers = nnx.List([TransformerBlock(dim, heads, dropout, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, rngs=rngs)

    def __call__(self, tokens):
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[1]))
        x = self.drop(x)
        for layer in self.layers:
            x = layer(x)
        return self.tokens.attend(self.norm(x))


def gpt(quick: bool = False, depth: int | None = None):
    vocab, dim, heads, context, batch = (128, 32, 2, 32, 4) if quick else (512, 128, 4, 128, 8)
    depth = depth or (2 if quick else 6)
    key = jax.random.key(42)
    tokens = jax.random.randint(key, (batch, context + 1), 0, vocab)

    def factory():
        return GPT(vocab, dim, heads, depth, context, 0.1, nnx.Rngs(params=0, dropout=1))

    return factory, _token_loss, (tokens[:, :-1], tokens[:, 1:])


class BasicBlock(nnx.Module):
    def __init__(self, cin, cout, stride, rngs):
        self.a = nnx.Conv(cin, cout, (3, 3), strides=(stride, stride), use_bias=False, rngs=rngs)
        self.na = nnx.BatchNorm(cout, rngs=rngs)
        self.b = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        self.nb = nnx.BatchNorm(cout, rngs=rngs)
        needs_proj = stride > 1 or cin != cout
        self.proj = nnx.data(
            nnx.Conv(cin, cout, (1, 1), strides=(stride, stride), rngs=rngs) if needs_proj else None
        )

    def __call__(self, x):
        y = self.nb(self.b(nnx.relu(self.na(self.a(x)))))
        return nnx.relu(y + (x if self.proj is None else self.proj(x)))


class ResNet(nnx.Module):
    def __init__(self, width, per_stage, classes, rngs):
        self.stem = nnx.Conv(3, width, (3, 3), use_bias=False, rngs=rngs)
        self.stem_norm = nnx.BatchNorm(width, rngs=rngs)
        blocks, cin = [], width
        for stage in range(3):
            cout = width * 2**stage
            for i in range(per_stage):
                blocks.append(BasicBlock(cin, cout, 2 if stage and not i else 1, rngs))
                cin = cout
        self.blocks = nnx.List(blocks)
        self.fc = nnx.Linear(cin, classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.stem_norm(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.fc(jnp.mean(x, axis=(1, 2)))


def _classify(model, images, labels):
    return optax_like_xent(model(images), labels)


def resnet(quick: bool = False):
    width, per_stage, batch, size = (8, 1, 4, 16) if quick else (16, 3, 16, 32)
    key = jax.random.key(3)
    images = jax.random.normal(key, (batch, size, size, 3))
    labels = jax.random.randint(jax.random.key(4), (batch,), 0, 10)
    return (lambda: ResNet(width, per_stage, 10, nnx.Rngs(0))), _classify, (images, labels)


class UNet(nnx.Module):
    """Ronneberger et al.'s U-Net shape: two 3x3 convolutions per level, average-pool
    down, transposed convolutions up, the decoder concatenating the encoder's maps."""

    def __init__(self, width, depth, rngs):
        widths = [width * 2**i for i in range(depth + 1)]

        def double(cin, cout):
            return nnx.List([nnx.Conv(cin, cout, (3, 3), rngs=rngs),
                             nnx.Conv(cout, cout, (3, 3), rngs=rngs)])  # fmt: skip

        self.enc = nnx.List(
            [double(1 if i == 0 else widths[i - 1], widths[i]) for i in range(depth)]
        )
        self.bottom = double(widths[depth - 1], widths[depth])
        self.up = nnx.List(
            [nnx.ConvTranspose(widths[i + 1], widths[i], (2, 2), strides=(2, 2), rngs=rngs)
             for i in reversed(range(depth))]
        )  # fmt: skip
        self.dec = nnx.List([double(2 * widths[i], widths[i]) for i in reversed(range(depth))])
        self.head = nnx.Conv(width, 1, (1, 1), rngs=rngs)

    def __call__(self, x):
        def convs(pair, x):
            for conv in pair:
                x = nnx.gelu(conv(x))
            return x

        skips = []
        for pair in self.enc:
            x = convs(pair, x)
            skips.append(x)
            x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
        x = convs(self.bottom, x)
        for up, pair, skip in zip(self.up, self.dec, reversed(skips), strict=True):
            x = convs(pair, jnp.concatenate([up(x), skip], axis=-1))
        return self.head(x)


def _denoise(model, noisy, clean):
    return jnp.mean((model(noisy) - clean) ** 2)


def unet(quick: bool = False):
    width, depth, batch, size = (4, 2, 2, 16) if quick else (16, 3, 8, 64)
    clean = jax.random.normal(jax.random.key(5), (batch, size, size, 1))
    noisy = clean + 0.1 * jax.random.normal(jax.random.key(6), clean.shape)
    return (lambda: UNet(width, depth, nnx.Rngs(0))), _denoise, (noisy, clean)


class ScannedTransformer(nnx.Module):
    def __init__(self, vocab, dim, heads, depth, context, rngs):
        self.tokens = nnx.Embed(vocab, dim, rngs=rngs)
        self.positions = nnx.Embed(context, dim, rngs=rngs)

        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def layers(rngs):
            return TransformerBlock(dim, heads, 0.0, rngs)

        self.layers = layers(rngs)
        self.norm = nnx.LayerNorm(dim, rngs=rngs)

    def __call__(self, tokens):
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[1]))

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def run(layer, x):
            return layer(x)

        return self.tokens.attend(self.norm(run(self.layers, x)))


def scanned(quick: bool = False, depth: int | None = None):
    vocab, dim, heads, context, batch = (128, 32, 2, 32, 4) if quick else (512, 128, 4, 128, 8)
    depth = depth or (4 if quick else 12)
    tokens = jax.random.randint(jax.random.key(7), (batch, context + 1), 0, vocab)

    def factory():
        return ScannedTransformer(vocab, dim, heads, depth, context, nnx.Rngs(0))

    return factory, _token_loss, (tokens[:, :-1], tokens[:, 1:])


MODELS = {"gpt": gpt, "resnet": resnet, "unet": unet, "scanned": scanned}


# ------------------------------------------------------------- shared by the scripts

JAX_POLICIES = ("checkpoint_dots", "nothing_saveable", "everything_saveable")


def budget_sweep(p, points: int) -> list[int]:
    """``points`` budgets (bytes) from the least feasible one to the store-all peak of
    plan ``p``, evenly spaced, exact integers."""
    least = p.least_budget()
    top = max(p.store_all_peak, least)
    return sorted({least + (top - least) * q // max(points - 1, 1) for q in range(points)})


def xla_temp_bytes(factory, loss_fn, args) -> int:
    """XLA's temporary bytes (``memory_analysis().temp_size_in_bytes``) of the plain
    compiled training step, ``jax.jit`` of ``nnx.value_and_grad(loss_fn)``."""
    graphdef, params, rest = nnx.split(factory(), nnx.Param, ...)

    def plain_step(params, rest, args):
        model = nnx.merge(graphdef, params, rest)
        return nnx.value_and_grad(loss_fn)(model, *args)

    compiled = jax.jit(plain_step).lower(params, rest, args).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def policy_plans(p) -> dict:
    """JAX's policies applied to every block of plan ``p``'s model, priced by the same
    simulator: ``{policy: plan}`` (a policy is a fixed schedule, whatever the budget)."""
    return {policy: p.replan(10**18, method=policy) for policy in JAX_POLICIES}
