"""More feature models (test_feature_models.py runs them with its helpers): training
objectives and layers of published models, written at stop 53 as a new user would:

- ``mae``: a masked autoencoder, patches kept by ``argsort`` of noise drawn from a key
  argument and put back by the inverse permutation, a learned mask token;
- ``mixup``: a mixing weight drawn from ``jax.random.beta`` (a rejection sampler's
  ``while_loop`` in ``loss_fn``, which no gradient reaches) and a permutation;
- ``reinforce``: a policy gradient, actions sampled by ``jax.random.categorical`` from
  the stopped logits, an entropy bonus;
- ``ppo``: the clipped surrogate (the ``minimum`` of the ratio and its clip, equal
  inside the clip range: a tie the gradient splits) and a value loss;
- ``crf``: a linear-chain CRF's negative log-likelihood, the forward algorithm by
  ``lax.scan`` over ``logsumexp``, transitions indexed by the gold tags;
- ``alibi``: ALiBi position biases through ``jax.nn.dot_product_attention(bias=...,
  is_causal=True)``, tied output embedding;
- ``espcn``: super-resolution by pixel shuffle (depth to space by reshape and
  transpose), an L1 loss;
- ``weight_std``: weight-standardized convolutions (the kernel normalized from the
  parameter each call, ``lax.conv_general_dilated``) with GroupNorm;
- ``triplet``: a triplet loss with batch-hard mining (masked maximum and minimum of
  pairwise distances), BatchNorm in training mode, normalized embeddings;
- ``dice``: a Dice plus binary cross-entropy segmentation loss on a small U-shaped net
  (max pooling, nearest upsampling by ``repeat``, a skip concatenation).

Each equalled plain ``nnx.value_and_grad`` when written.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from feature_models import _case, _key, _metrics, classify
from feature_models_patterns import next_token
from flax import nnx
from zoo import Case


class MAE(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.embed = nnx.Linear(12, 16, rngs=rngs)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (8, 16)))
        self.encoder = nnx.Linear(16, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.mask_token = nnx.Param(jnp.zeros((16,)))
        self.decoder = nnx.Linear(16, 12, rngs=rngs)

    def __call__(self, patches, key):
        b, n, _ = patches.shape
        keep = n // 2
        x = self.embed(patches) + self.positions[...]
        shuffle = jnp.argsort(jax.random.uniform(key, (b, n)), axis=1)
        restore = jnp.argsort(shuffle, axis=1)
        kept = jnp.take_along_axis(x, shuffle[:, :keep, None], axis=1)
        h = self.norm(kept + jax.nn.gelu(self.encoder(kept)))
        masked = jnp.broadcast_to(self.mask_token[...], (b, n - keep, h.shape[-1]))
        h = jnp.take_along_axis(jnp.concatenate([h, masked], 1), restore[..., None], axis=1)
        return self.decoder(h), (restore >= keep).astype(jnp.float32)


def mae_loss(model, patches, key):
    predicted, masked = model(patches, key)
    return jnp.sum(jnp.mean((predicted - patches) ** 2, -1) * masked) / jnp.sum(masked)


def mae() -> Case:
    patches = jax.random.normal(_key(901), (2, 8, 12))
    factory = lambda: MAE(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("mae", factory, _metrics(mae_loss), (patches, _key(902)),
                 "random masking by argsort of noise, inverse permutation")  # fmt: skip


class MLP(nnx.Module):
    def __init__(self, din: int = 6, dout: int = 3, *, rngs: nnx.Rngs):
        self.a, self.b = nnx.Linear(din, 24, rngs=rngs), nnx.Linear(24, dout, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        return self.b(self.drop(jax.nn.relu(self.a(x))))


def mixup_loss(model, x, y, key):
    k1, k2 = jax.random.split(key)
    lam = jax.random.beta(k1, 0.4, 0.4)
    perm = jax.random.permutation(k2, x.shape[0])
    mixed, labels = lam * x + (1 - lam) * x[perm], lam * y + (1 - lam) * y[perm]
    return optax.softmax_cross_entropy(model(mixed), labels).mean()


def mixup() -> Case:
    x = jax.random.normal(_key(903), (8, 6))
    y = jax.nn.one_hot(jax.random.randint(_key(904), (8,), 0, 3), 3)
    factory = lambda: MLP(rngs=nnx.Rngs(0, dropout=1))  # noqa: E731
    return _case("mixup", factory, _metrics(mixup_loss), (x, y, _key(905)),
                 "jax.random.beta (a while_loop) and a permutation in the loss")  # fmt: skip


def reinforce_loss(model, obs, rewards, key):
    logits = model(obs)
    actions = jax.random.categorical(key, jax.lax.stop_gradient(logits))
    logp = jax.nn.log_softmax(logits)
    chosen = jnp.take_along_axis(logp, actions[:, None], 1)[:, 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, -1).mean()
    return -jnp.mean(chosen * (rewards - rewards.mean())) - 0.01 * entropy


def reinforce() -> Case:
    obs, rewards = jax.random.normal(_key(906), (10, 6)), jax.random.normal(_key(907), (10,))
    factory = lambda: MLP(rngs=nnx.Rngs(0, dropout=1))  # noqa: E731
    return _case("reinforce", factory, _metrics(reinforce_loss), (obs, rewards, _key(908)),
                 "actions sampled by jax.random.categorical, entropy bonus")  # fmt: skip


class ActorCritic(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.body = nnx.Linear(6, 32, rngs=rngs)
        self.policy, self.value = nnx.Linear(32, 4, rngs=rngs), nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        h = jnp.tanh(self.body(x))
        return self.policy(h), self.value(h)[:, 0]


def ppo_loss(model, obs, actions, old_logp, advantages, returns):
    logits, values = model(obs)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[:, None], 1)[:, 0]
    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.clip(ratio, 0.8, 1.2)
    surrogate = -jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    return surrogate + 0.5 * jnp.mean((values - returns) ** 2)


def ppo() -> Case:
    obs, actions = jax.random.normal(_key(909), (12, 6)), jax.random.randint(_key(910), (12,), 0, 4)
    old_logp = jnp.log(jnp.full((12,), 0.25)) + 0.05 * jax.random.normal(_key(911), (12,))
    advantages, returns = jax.random.normal(_key(912), (12,)), jax.random.normal(_key(913), (12,))
    factory = lambda: ActorCritic(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("ppo", factory, _metrics(ppo_loss),
                 (obs, actions, old_logp, advantages, returns),
                 "clipped surrogate: minimum of tied values, value loss")  # fmt: skip


class CRFTagger(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(30, 16, rngs=rngs)
        self.conv = nnx.Conv(16, 16, (3,), rngs=rngs)
        self.emissions = nnx.Linear(16, 5, rngs=rngs)
        self.transitions = nnx.Param(0.1 * jax.random.normal(rngs.params(), (5, 5)))

    def __call__(self, tokens):
        return self.emissions(jax.nn.relu(self.conv(self.embed(tokens))))


def crf_loss(model, tokens, tags):
    emissions, trans = model(tokens), model.transitions[...]

    def forward(alpha, e):
        return jax.nn.logsumexp(alpha[:, :, None] + trans[None], axis=1) + e, None

    alpha, _ = jax.lax.scan(forward, emissions[:, 0], emissions[:, 1:].swapaxes(0, 1))
    gold = jnp.take_along_axis(emissions, tags[..., None], -1)[..., 0].sum(1)
    gold += trans[tags[:, :-1], tags[:, 1:]].sum(1)
    return jnp.mean(jax.nn.logsumexp(alpha, -1) - gold)


def crf() -> Case:
    tokens = jax.random.randint(_key(914), (3, 7), 0, 30)
    tags = jax.random.randint(_key(915), (3, 7), 0, 5)
    factory = lambda: CRFTagger(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("crf", factory, _metrics(crf_loss), (tokens, tags),
                 "linear-chain CRF: forward algorithm by lax.scan")  # fmt: skip


class ALiBi(nnx.Module):
    def __init__(self, heads: int = 4, *, rngs: nnx.Rngs):
        self.heads = heads
        self.embed = nnx.Embed(40, 16, rngs=rngs)
        self.qkv, self.out = nnx.Linear(16, 48, rngs=rngs), nnx.Linear(16, 16, rngs=rngs)
        self.norm, self.mlp = nnx.LayerNorm(16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        b, t, d = x.shape
        h = self.heads
        q, k, v = (z.reshape(b, t, h, d // h) for z in jnp.split(self.qkv(self.norm(x)), 3, -1))
        slopes = 2.0 ** (-8.0 * jnp.arange(1, h + 1) / h)
        distance = jnp.minimum(jnp.arange(t)[None, :] - jnp.arange(t)[:, None], 0)
        bias = (slopes[:, None, None] * distance)[None]
        attended = jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True)
        x = x + self.out(attended.reshape(b, t, d))
        return self.embed.attend(x + jax.nn.gelu(self.mlp(x)))


def alibi() -> Case:
    tokens = jax.random.randint(_key(916), (2, 10), 0, 40)
    factory = lambda: ALiBi(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("alibi", factory, _metrics(next_token), (tokens,),
                 "ALiBi biases in jax.nn.dot_product_attention, tied output")  # fmt: skip


class ESPCN(nnx.Module):
    def __init__(self, r: int = 2, *, rngs: nnx.Rngs):
        self.r = r
        self.c1 = nnx.Conv(1, 16, (5, 5), rngs=rngs)
        self.c2 = nnx.Conv(16, 8, (3, 3), rngs=rngs)
        self.c3 = nnx.Conv(8, r * r, (3, 3), rngs=rngs)

    def __call__(self, x):
        h = self.c3(jnp.tanh(self.c2(jnp.tanh(self.c1(x)))))
        b, height, width, _ = h.shape
        r = self.r
        h = h.reshape(b, height, width, r, r, 1).transpose(0, 1, 3, 2, 4, 5)
        return h.reshape(b, height * r, width * r, 1)


def l1(model, low, high):
    return jnp.mean(jnp.abs(model(low) - high))


def espcn() -> Case:
    low, high = (
        jax.random.normal(_key(917), (2, 8, 8, 1)),
        jax.random.normal(_key(918), (2, 16, 16, 1)),
    )
    factory = lambda: ESPCN(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("espcn", factory, _metrics(l1), (low, high), "pixel shuffle, L1 loss")


class StandardizedConv(nnx.Module):
    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.kernel = nnx.Param(init(rngs.params(), (3, 3, cin, cout)))
        self.norm = nnx.GroupNorm(cout, num_groups=2, rngs=rngs)

    def __call__(self, x):
        w = self.kernel[...]
        w = (w - w.mean((0, 1, 2))) / jnp.sqrt(w.var((0, 1, 2)) + 1e-5)
        numbers = ("NHWC", "HWIO", "NHWC")
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers)
        return jax.nn.relu(self.norm(y))


class StandardizedNet(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a, self.b = StandardizedConv(3, 8, rngs=rngs), StandardizedConv(8, 8, rngs=rngs)
        self.head = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x):
        return self.head(self.b(self.a(x)).mean((1, 2)))


def weight_std() -> Case:
    x, y = jax.random.normal(_key(919), (2, 8, 8, 3)), jnp.array([1, 3])
    factory = lambda: StandardizedNet(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("weight_std", factory, _metrics(classify), (x, y),
                 "kernels standardized each call, GroupNorm")  # fmt: skip


class Embedding(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.a, self.b = nnx.Linear(10, 32, rngs=rngs), nnx.Linear(32, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(32, rngs=rngs)

    def __call__(self, x):
        z = self.b(jax.nn.relu(self.bn(self.a(x))))
        return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def triplet_loss(model, x, ids, margin=0.3):
    z = model(x)
    d = jnp.sqrt(jnp.sum((z[:, None] - z[None]) ** 2, -1) + 1e-9)
    same = ids[:, None] == ids[None]
    hardest_positive = jnp.max(jnp.where(same & ~jnp.eye(len(ids), dtype=bool), d, -1.0), 1)
    hardest_negative = jnp.min(jnp.where(same, 10.0, d), 1)
    return jnp.mean(jax.nn.relu(hardest_positive - hardest_negative + margin))


def triplet() -> Case:
    x, ids = jax.random.normal(_key(920), (12, 10)), jnp.arange(12) % 4
    factory = lambda: Embedding(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("triplet", factory, _metrics(triplet_loss), (x, ids),
                 "batch-hard triplet mining, BatchNorm, normalized embeddings")  # fmt: skip


class TinySegmenter(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.down = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.middle = nnx.Conv(8, 8, (3, 3), rngs=rngs)
        self.up = nnx.Conv(16, 1, (3, 3), rngs=rngs)

    def __call__(self, x):
        a = jax.nn.relu(self.down(x))
        m = jax.nn.relu(self.middle(nnx.max_pool(a, (2, 2), (2, 2))))
        m = jnp.repeat(jnp.repeat(m, 2, axis=1), 2, axis=2)
        return self.up(jnp.concatenate([a, m], -1))


def dice_loss(model, x, y):
    logits = model(x)
    p = jax.nn.sigmoid(logits)
    dice = 1 - (2 * jnp.sum(p * y) + 1) / (jnp.sum(p) + jnp.sum(y) + 1)
    return dice + optax.sigmoid_binary_cross_entropy(logits, y).mean()


def dice() -> Case:
    x = jax.random.normal(_key(921), (2, 12, 12, 1))
    y = (jax.random.uniform(_key(922), (2, 12, 12, 1)) > 0.5).astype(jnp.float32)
    factory = lambda: TinySegmenter(rngs=nnx.Rngs(0))  # noqa: E731
    return _case("dice", factory, _metrics(dice_loss), (x, y),
                 "Dice + BCE, max pooling, upsampling by repeat")  # fmt: skip


OBJECTIVE_CASES: dict[str, Callable[[], Case]] = {
    "mae": mae,
    "mixup": mixup,
    "reinforce": reinforce,
    "ppo": ppo,
    "crf": crf,
    "alibi": alibi,
    "espcn": espcn,
    "weight_std": weight_std,
    "triplet": triplet,
    "dice": dice,
}
