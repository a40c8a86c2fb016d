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


def assert_trees_close(got, want, what: str = "", rtol: float = 1e-5) -> None:
    """Same pytree leaves, each within ``rtol`` (and 1e-5 of the largest magnitude)."""
    import numpy as np

    la, lb = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(la) == len(lb), what
    for u, v in zip(la, lb, strict=True):
        u, v = np.asarray(u), np.asarray(v)
        np.testing.assert_allclose(
            u, v, rtol=rtol, atol=1e-5 * float(np.abs(v).max()), err_msg=what
        )
