"""The compiled path records a block without JAX's rounding of float32 residuals to
float32 (a no-op that XLA keeps, and that made it copy the rounded values' producers
into each of their readers: jax_exec.execute.rounding); bfloat16 ones keep it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jax_exec import auto
from jax_exec.execute.rounding import unrounded, without_noop_rounding


def record(x, w):
    """A checkpointed function's forward and the residuals it saves (the named one)."""

    def f(x):
        h = checkpoint_name(jax.nn.gelu(x @ w, approximate=False), "h")
        return jnp.sum(jnp.tanh(h) * h)

    policy = jax.checkpoint_policies.save_only_these_names("h")
    y, vjp_fn = jax.vjp(jax.checkpoint(f, policy=policy), x)
    return y, jax.tree_util.tree_leaves(vjp_fn)


def roundings(closed) -> int:
    return sum(e.primitive.name == "reduce_precision" for e in closed.jaxpr.eqns)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_noop_rounding_removed_for_float32_only(dtype):
    x = jax.random.normal(jax.random.key(0), (4, 8), dtype)
    w = jax.random.normal(jax.random.key(1), (8, 8), dtype)
    closed = jax.make_jaxpr(record)(x, w)
    assert roundings(closed) > 0  # JAX rounds the saved residual
    stripped = without_noop_rounding(closed)
    assert roundings(stripped) == (roundings(closed) if dtype == jnp.bfloat16 else 0)
    want = jax.tree_util.tree_leaves(jax.jit(record)(x, w))
    got = jax.tree_util.tree_leaves(jax.jit(unrounded(record))(x, w))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):  # float32: the same values, fused otherwise
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-6, atol=1e-7)  # fmt: skip


class Mlp(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(3)])

    def __call__(self, x):
        for layer in self.layers:
            x = jax.nn.gelu(layer(x), approximate=False)
        return x


def test_compiled_step_keeps_no_float32_rounding():
    """At store-all every block is a Record: the step's StableHLO has no rounding."""
    x = jax.random.normal(jax.random.key(2), (4, 16))

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)

    model = Mlp(rngs=nnx.Rngs(0))
    p = auto.plan(loss_fn, model, x, budget="100%", exact=False)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    step = jax.jit(jax.value_and_grad(p.lowered(), has_aux=True))
    assert "reduce_precision" not in step.lower(params, rest, (x,)).as_text()
    (loss, _), grads = step(params, rest, (x,))
    want_loss, want_grads = nnx.value_and_grad(loss_fn)(model, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(grads), leaves(want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
