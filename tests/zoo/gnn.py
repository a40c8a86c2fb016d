"""A graph neural network over dense adjacency matrices (batched small graphs, as dense
GNN tutorials write it): GCN layers (Kipf & Welling) with the symmetric normalisation
``D^-1/2 (A + I) D^-1/2`` computed in the model from the ``adj`` argument, a GAT-style layer
(Velickovic et al.: per-head attention logits from source and target terms, LeakyReLU,
masked by the adjacency with ``jnp.where``), dropout, a node mask for padded nodes, and a
masked mean readout to a graph-level classifier."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import Case


@dataclass
class GNNConfig:
    in_features: int = 8
    hidden: int = 32
    gcn_layers: int = 2
    gat_heads: int = 4
    num_classes: int = 3
    dropout: float = 0.1


def normalize_adjacency(adj):
    a = adj + jnp.eye(adj.shape[-1], dtype=adj.dtype)[None]
    deg = jnp.sum(a, axis=-1)
    d_inv_sqrt = jnp.where(deg > 0, jax.lax.rsqrt(jnp.maximum(deg, 1e-12)), 0.0)
    return a * d_inv_sqrt[:, :, None] * d_inv_sqrt[:, None, :]


class GCNLayer(nnx.Module):
    def __init__(self, fin: int, fout: int, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(fin, fout, rngs=rngs)

    def __call__(self, x, a_hat):
        return a_hat @ self.linear(x)


class GATLayer(nnx.Module):
    def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs):
        self.heads = heads
        self.proj = nnx.Linear(dim, dim, use_bias=False, rngs=rngs)
        init = nnx.initializers.glorot_uniform()
        self.a_src = nnx.Param(init(rngs.params(), (heads, dim // heads)))
        self.a_dst = nnx.Param(init(rngs.params(), (heads, dim // heads)))

    def __call__(self, x, adj):
        b, n, d = x.shape
        h = self.proj(x).reshape(b, n, self.heads, d // self.heads)
        src = jnp.einsum("bnhf,hf->bhn", h, self.a_src[...])
        dst = jnp.einsum("bnhf,hf->bhn", h, self.a_dst[...])
        logits = jax.nn.leaky_relu(dst[:, :, :, None] + src[:, :, None, :], 0.2)
        edges = (adj + jnp.eye(n)[None]) > 0
        logits = jnp.where(edges[:, None], logits, -1e9)
        att = jax.nn.softmax(logits, axis=-1)  # (b, h, target, source)
        out = jnp.einsum("bhij,bjhf->bihf", att, h)
        return out.reshape(b, n, d)


class GraphClassifier(nnx.Module):
    def __init__(self, cfg: GNNConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dims = [cfg.in_features] + [cfg.hidden] * cfg.gcn_layers
        self.gcn = nnx.List(
            [GCNLayer(dims[i], dims[i + 1], rngs=rngs) for i in range(cfg.gcn_layers)]
        )
        self.gat = GATLayer(cfg.hidden, cfg.gat_heads, rngs=rngs)
        self.norm = nnx.LayerNorm(cfg.hidden, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.readout = nnx.Linear(cfg.hidden, cfg.num_classes, rngs=rngs)

    def __call__(self, x, adj, node_mask):
        a_hat = normalize_adjacency(adj)
        m = node_mask[..., None].astype(x.dtype)
        for layer in self.gcn:
            x = self.dropout(nnx.relu(layer(x, a_hat))) * m
        x = self.norm(x + nnx.elu(self.gat(x, adj))) * m
        pooled = jnp.sum(x, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
        return self.readout(pooled)


def make(seed: int = 0, cfg: GNNConfig | None = None) -> Case:
    cfg = cfg or GNNConfig()
    b, n = 3, 10
    key = jax.random.key(seed + 1)
    sizes = jnp.array([10, 7, 5])
    node_mask = jnp.arange(n)[None] < sizes[:, None]
    upper = jnp.triu(jax.random.uniform(jax.random.fold_in(key, 1), (b, n, n)) < 0.3, k=1)
    pair = node_mask[:, :, None] & node_mask[:, None, :]
    adj = ((upper | jnp.swapaxes(upper, 1, 2)) & pair).astype(jnp.float32)
    x = jax.random.normal(key, (b, n, cfg.in_features)) * node_mask[..., None]
    labels = jax.random.randint(jax.random.fold_in(key, 2), (b,), 0, cfg.num_classes)

    def loss_fn(model, x, adj, node_mask, labels):
        logits = model(x, adj, node_mask)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def aux_loss_fn(model, x, adj, node_mask, labels):
        logits = model(x, adj, node_mask)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}

    return Case(
        name="gnn",
        factory=lambda: GraphClassifier(cfg, rngs=nnx.Rngs(seed)),
        loss_fn=loss_fn,
        aux_loss_fn=aux_loss_fn,
        args=(x, adj, node_mask, labels),
        notes="dense adjacency argument, GCN symmetric normalisation in the model, batched "
        "matmul message passing, GAT attention masked by jnp.where, boolean node mask "
        "argument, dropout, masked mean readout",
    )
