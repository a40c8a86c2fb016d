"""The compiled path with activation offload: gradients and where residuals live."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_exec
import solvers
from jax_exec.models import mlp_stack, mse_loss
from jax_exec.offload.lowering import (
    lower_offload,
    offload_residuals,
    offload_value_and_grad,
    split_schedule,
)
from schedir import Offload, OffloadProblem, Platform
from solvers.offload.rotor_offload import build_table

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def mlp():
    kx, ky = jax.random.split(jax.random.key(3))
    layers = mlp_stack(depth=4, width=32, hidden=64, in_dim=16, out_dim=8, seed=1)
    x = jax.random.normal(kx, (16, 16), jnp.float32)
    y = jax.random.normal(ky, (16, 8), jnp.float32)
    chain = jax_exec.profile(layers, mse_loss, x, y, timing="flops")
    problem = OffloadProblem(chain, Platform.host_offload(1e9))
    return layers, x, y, problem, build_table(problem, 64).min_budget()


def key(r) -> tuple:
    return (r.shape, r.dtype)


@pytest.mark.parametrize("extra", [0, 2048])
def test_offload_lowering_gradients_and_host_residuals(mlp, extra):
    layers, x, y, problem, least = mlp
    schedule = solvers.solve(problem, least + extra, "rotor_offload", max_units=1)
    chain_ops, offloaded = split_schedule(schedule)
    assert bool(offloaded) == any(isinstance(op, Offload) for op in schedule.ops)
    loss, grads = offload_value_and_grad(layers, mse_loss, schedule)(x, y)
    via_public, _ = jax_exec.stages_value_and_grad(layers, mse_loss, schedule)(x, y)  # dispatches
    np.testing.assert_allclose(via_public, loss, rtol=1e-6)
    want_loss, want = jax_exec.stages_value_and_grad(layers, mse_loss, chain_ops)(x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    for got, ref in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want), strict=True
    ):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # residuals at the top level: offloaded ones are in host memory (JAX marks their
    # abstract value <host>, on CPU too); the device keeps the plain lowering's minus them
    lowered = lower_offload(layers, mse_loss, schedule)
    device, host = offload_residuals(lowered, x, y)
    plain_residuals = jax_exec.saved_activations(jax_exec.lower(layers, mse_loss, chain_ops), x, y)
    plain = Counter(map(key, plain_residuals))
    on_device = Counter(map(key, device))
    if not offloaded:
        assert not host and on_device == plain
        return
    assert host and on_device <= plain
    assert sum(r.nbytes for r in device) < sum(r.nbytes for r in plain_residuals)
    assert set(map(key, host)) <= set(plain)
    if any(isinstance(op, Offload) and op.buffer == "a[0]" for op in schedule.ops):
        assert (tuple(x.shape), str(x.dtype)) in set(map(key, host))
        assert (tuple(x.shape), str(x.dtype)) not in on_device
