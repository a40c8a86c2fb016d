"""The reference the JAX executors are checked against: plain ``jax.value_and_grad`` of
a stage list's loss."""

from __future__ import annotations

import jax

from jax_exec.stages import as_stages, plain_loss


def plain_value_and_grad(layers, loss_fn):
    """``f(x, y) -> (loss, grads)``: plain autodiff of the layers (one pytree per layer)."""
    stages = as_stages(layers)
    step = jax.jit(jax.value_and_grad(plain_loss(stages, loss_fn)))
    return lambda x, y: step([s.params for s in stages], x, y)
