"""The compiled path with activation offload: gradients and where residuals live."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_exec
import solvers
from jax_exec.execute.tree import split_copies
from schedir import Offload, OffloadProblem, Platform
from schedir_cli.models import mlp_stack, mse_loss
from solvers.offload.rotor_offload import build_table

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def mlp():
    kx, ky = jax.random.split(jax.random.key(3))
    layers = mlp_stack(depth=4, width=32, hidden=64, in_dim=16, out_dim=8, seed=1)
    x = jax.random.normal(kx, (16, 16), jnp.float32)
    y = jax.random.normal(ky, (16, 8), jnp.float32)
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    problem = OffloadProblem(chain, Platform.host_offload(1e9))
    return layers, x, y, problem, build_table(problem, 64).min_budget()


def key(r) -> tuple:
    return (r.shape, r.dtype)


@pytest.mark.parametrize("extra", [0, 2048])
def test_offload_lowering_gradients_and_host_residuals(mlp, extra):
    layers, x, y, problem, least = mlp
    schedule = solvers.solve(problem, least + extra, "rotor_offload", max_units=1)
    chain_ops, offloaded = split_copies(schedule.ops)
    assert bool(offloaded) == any(isinstance(op, Offload) for op in schedule.ops)
    loss, grads = jax_exec.stages.value_and_grad(layers, mse_loss, schedule)(x, y)
    want_loss, want = jax_exec.stages.value_and_grad(layers, mse_loss, chain_ops)(x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    for got, ref in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want), strict=True
    ):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # residuals at the top level: offloaded ones are in host memory (JAX marks their
    # abstract value <host>, on CPU too); the device keeps the plain lowering's minus them
    lowered = jax_exec.stages.lower(layers, mse_loss, schedule)
    device = jax_exec.stages.saved_activations(lowered, x, y)
    host = jax_exec.stages.saved_activations(lowered, x, y, host=True)
    plain_lowered = jax_exec.stages.lower(layers, mse_loss, chain_ops)
    plain_residuals = jax_exec.stages.saved_activations(plain_lowered, x, y)
    plain = Counter(map(key, plain_residuals))
    on_device = Counter(map(key, device))
    if not offloaded:
        assert not host and on_device == plain
        return
    assert host and on_device <= plain
    assert sum(r.nbytes for r in device) < sum(r.nbytes for r in plain_residuals)
    assert set(map(key, host)) <= set(plain)
