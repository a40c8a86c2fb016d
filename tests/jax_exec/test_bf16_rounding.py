"""A model computing in bfloat16 end to end (parameters, LayerNorm, activations).

The compiled path (``Plan.lowered`` under ``jax.jit``) equals plain ``nnx.value_and_grad``
under ``nnx.jit`` within float32's tolerance. The op-by-op runtime runs each block as a
kernel of its own, so its bfloat16 values are rounded at every kernel's boundary, where
XLA keeps a fused step's intermediates in float32: it differs from the jitted step as
plain ``nnx.value_and_grad`` called eagerly (every operation a kernel) does. That is the
yardstick here, since the float64 arbiter of plain_reference cannot widen a model that
casts to bfloat16 itself: per part, the op-by-op result is no further from the jitted
one than ``ROUNDING_FACTOR`` times the eager call's largest leaf distance (seen: loss
2.5e-5 relative for both, gradients 2.2e-3 of the scale against eager's 2.6e-3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from plain_reference import ROUNDING_FACTOR, assert_matches, distance, plain, scale_of

import jax_exec


class BF16MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
        self.l1, self.norm = nnx.Linear(24, 48, **kw), nnx.LayerNorm(48, **kw)
        self.l2 = nnx.Linear(48, 24, **kw)

    def __call__(self, x):
        h = nnx.gelu(self.norm(self.l1(x.astype(jnp.bfloat16))))
        return self.l2(h) + x.astype(jnp.bfloat16)


def mse(model, x, y):
    return jnp.mean((model(x).astype(jnp.float32) - y) ** 2)


def factory():
    return BF16MLP(nnx.Rngs(0))


def test_bfloat16_model_on_both_paths():
    x = jax.random.normal(jax.random.key(1), (4, 16, 24))
    y = jax.random.normal(jax.random.key(2), (4, 16, 24))
    jitted = plain(factory, mse, (x, y))
    eager_loss, eager_grads = nnx.value_and_grad(mse)(factory(), x, y)
    top = jax_exec.plan(mse, factory(), x, y, budget="100%")
    for budget in (top.budget, top.least_budget()):
        p = top.replan(budget)
        what = f"bfloat16 MLP at {budget:,} B"
        model = factory()
        _, params, rest = nnx.split(model, nnx.Param, ...)
        (loss, _), grads = jax.jit(jax.value_and_grad(p.lowered(), has_aux=True))(
            params, rest, (x, y)
        )
        assert_matches(loss, grads, None, jitted, f"{what}, compiled")
        result = p.run(model, x, y)
        assert result.peak_bytes == p.schedule.meta["peak_memory"] <= p.budget, what
        for part, got, eager, want in (
            ("loss", [result.loss], [eager_loss], [jitted[0]]),
            ("gradients", jax.tree.leaves(result.grads), jax.tree.leaves(eager_grads),
             jax.tree.leaves(jitted[2])),
        ):  # fmt: skip
            rounding = max(distance(e, w) for e, w in zip(eager, want, strict=True))
            assert rounding > 0, f"{what}: eager JAX rounds otherwise than jit ({part})"
            worst = max(distance(g, w) for g, w in zip(got, want, strict=True))
            assert worst <= ROUNDING_FACTOR * rounding, (
                f"{what}, op by op: {part} {worst / scale_of(want):.2e} of the scale from the "
                f"jitted step, eager JAX {rounding / scale_of(want):.2e}"
            )
