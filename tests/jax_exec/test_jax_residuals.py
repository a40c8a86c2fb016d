"""jax_exec.execute.residuals: the one private JAX call. These fail when JAX moves
``saved_residuals`` or changes what it returns."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_exec.execute.residuals import saved_residuals


def shapes(found):
    return sorted((tuple(int(d) for d in aval.shape), str(aval.dtype)) for aval, _ in found)


def test_saved_residuals_reports_shapes_and_sources():
    def f(w, x):
        return jnp.sum(jnp.sin(x @ w))

    w, x = jnp.ones((3, 4)), jnp.ones((2, 3))
    found = saved_residuals(f, w, x)
    # x @ w is (2, 4): sin's derivative needs it (cos of it); the matmul needs w and x
    assert all(isinstance(source, str) for _, source in found)
    computed = [(aval, src) for aval, src in found if not src.startswith("from the argument")]
    assert shapes(computed) == [((2, 4), "float32")]
    arguments = sorted(src for _, src in found if src.startswith("from the argument"))
    assert arguments == ["from the argument w", "from the argument x"]


def test_checkpointed_function_saves_only_its_arguments():
    def f(w, x):
        return jnp.sum(jnp.sin(x @ w))

    w, x = jnp.ones((3, 4)), jnp.ones((2, 3))
    nothing = jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)
    found = saved_residuals(nothing, w, x)
    assert all(src.startswith("from the argument") for _, src in found), found
    assert shapes(found) == [((2, 3), "float32"), ((3, 4), "float32")]
    everything = jax.checkpoint(f, policy=jax.checkpoint_policies.everything_saveable)
    assert ((2, 4), "float32") in shapes(saved_residuals(everything, w, x))
