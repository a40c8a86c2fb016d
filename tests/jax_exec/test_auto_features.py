"""Graph extraction on what Flax users write: pytree arguments with integer leaves, a
nested ``jax.jit``, ``custom_vjp`` and ``custom_jvp`` functions (opaque nodes), a
``jax.lax.scan`` over stacked weights, a weight used twice (tied: one gradient,
summed); and the error for a collective.

Oracle: plain ``nnx.value_and_grad`` (``check_plan`` of test_auto_plan.py: op by op and
compiled, measured memory = the simulator's, saved residuals = the plan's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec
from test_auto_plan import check_plan, reference

from jax_exec import auto
from jax_exec.auto import UnsupportedModel


@jax.custom_vjp
def clipped(x):
    """The identity whose backward clips the cotangent (a custom_vjp)."""
    return x


clipped.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.05, 0.05),))


@jax.custom_jvp
def softplus(x):
    return jnp.logaddexp(x, 0.0)


softplus.defjvps(lambda t, ans, x: t * jax.nn.sigmoid(x))


@jax.jit
def mix(w, h):
    return jnp.tanh(h @ w) + h


class Features(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(12, 8, rngs=rngs)
        self.stack = nnx.Param(0.3 * jax.random.normal(rngs.params(), (3, 8, 8)))
        self.w = nnx.Param(0.3 * jax.random.normal(rngs.params(), (8, 8)))

    def __call__(self, batch: dict):
        h = self.embed(batch["tokens"]) * batch["scale"][..., None]
        h = clipped(softplus(h))

        def layer(h, w):
            return mix(w, h), None

        h, _ = jax.lax.scan(layer, h, self.stack[...])
        h = jnp.tanh(h @ self.w) @ self.w.T  # the same weight twice
        return self.embed.attend(h)  # tied with the embedding


def xent(model, batch):
    logp = jax.nn.log_softmax(model(batch))
    return -jnp.mean(jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1))


def test_pytrees_nested_jit_custom_rules_scan_tied_weights():
    tokens = jax.random.randint(jax.random.key(3), (4, 6), 0, 12)
    batch = {"tokens": tokens, "scale": jnp.linspace(0.5, 1.5, 6), "targets": tokens[:, ::-1]}

    def factory():
        return Features(nnx.Rngs(0))

    args = (batch,)
    ref = reference(factory, xent, args)
    p = auto.plan(xent, factory(), *args, budget="100%")
    names = {e.name for e in p.model.program.eqns}
    assert {"custom_vjp_call", "custom_jvp_call"} <= names  # opaque nodes
    assert "pjit" not in names and "scan" not in names  # inlined, unrolled
    for budget in (p.store_all_peak, p.least_budget()):
        check_plan(p.replan(budget), factory, xent, args, ref)


class Collective(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        mesh = jax.make_mesh((1,), ("d",))
        spec = PartitionSpec()
        total = jax.shard_map(lambda h: jax.lax.psum(h, "d"), mesh=mesh, in_specs=spec,
                              out_specs=spec)  # fmt: skip
        return total(self.lin(x))


def test_collective_is_refused_with_its_source():
    pattern = r"multi-device operation shard_map at .*test_auto_features.py:\d+.*one device"
    with pytest.raises(UnsupportedModel, match=pattern):
        auto.plan(lambda m, x: m(x).sum(), Collective(nnx.Rngs(0)), jnp.ones((2, 4)),
                  budget="50%", exact=False)  # fmt: skip
