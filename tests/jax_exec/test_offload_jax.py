"""Executing offload schedules in JAX: gradients and measured device/host bytes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_reference import plain_value_and_grad

import jax_exec
import schedir
import solvers
from jax_exec import measure_platform
from schedir import Offload, OffloadProblem, Platform, Prefetch
from schedir_cli.models import mlp_stack, mse_loss
from solvers.offload.rotor_offload import build_table

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)


def plain(layers, x, y):
    return plain_value_and_grad(layers, mse_loss)(x, y)


@pytest.fixture(scope="module")
def mlp():
    kx, ky = jax.random.split(jax.random.key(3))
    layers = mlp_stack(depth=4, width=32, hidden=64, in_dim=16, out_dim=8, seed=1)
    x = jax.random.normal(kx, (16, 16), jnp.float32)
    y = jax.random.normal(ky, (16, 8), jnp.float32)
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    return layers, x, y, chain


@pytest.mark.parametrize("bandwidth", [1e9, math.inf])
def test_run_offload_schedule_matches_grad_and_simulator(mlp, bandwidth):
    layers, x, y, chain = mlp
    problem = OffloadProblem(chain, Platform.host_offload(bandwidth))
    table = build_table(problem, 64)
    for extra in (0, 1024, 2048, 4096, 8192):  # a budget at which rotor_offload offloads
        budget = table.min_budget() + extra
        schedule = solvers.solve(problem, budget, "rotor_offload", max_units=1)
        kinds = {type(op) for op in schedule.ops}
        if Offload in kinds and Prefetch in kinds:
            break
    assert Offload in kinds and Prefetch in kinds
    result = jax_exec.run(layers, mse_loss, schedule, x, y)  # the core runs copy ops
    trace = schedir.simulate_offload(problem, schedule)
    assert result.resident_bytes == trace.resident
    assert result.host_bytes == trace.host_resident
    assert max(result.resident_bytes) <= budget
    loss, grads = plain(layers, x, y)
    np.testing.assert_allclose(result.loss, loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(result.grads),
                         jax.tree_util.tree_leaves(grads), strict=True):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_measure_platform():
    platform = measure_platform(1 << 20, repeats=2)
    assert platform.offload.bandwidth > 0 and platform.prefetch.bandwidth > 0
    assert math.isfinite(platform.offload.latency)
