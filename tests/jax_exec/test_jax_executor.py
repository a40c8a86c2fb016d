"""The executor protocol: one ``jax_exec.run`` dispatching by schedule class, one result."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_reference import plain_value_and_grad

import jax_exec
import schedir
import solvers
from jax_exec.executor import EXECUTORS, executor_for
from jax_exec.graph.runtime import run_graph
from schedir import GraphSchedule, OffloadSchedule, Schedule
from schedir_cli.models import mlp_stack, mse_loss, residual_dag

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def mlp():
    kx, ky = jax.random.split(jax.random.key(0))
    layers = mlp_stack(depth=2, width=16, hidden=32, in_dim=8, out_dim=4, seed=0)
    x = jax.random.normal(kx, (8, 8), jnp.float32)
    y = jax.random.normal(ky, (8, 4), jnp.float32)
    return layers, x, y


def test_one_result_class():
    empty = jax_exec.RunResult()
    assert empty.host_bytes == () and empty.device_peaks == {}


def test_registry_maps_each_schedule_class_to_its_executor():
    assert set(EXECUTORS) >= {Schedule, OffloadSchedule, GraphSchedule}
    assert executor_for(OffloadSchedule(()))[0] is jax_exec.stages.run
    # a plain op list runs on the core (copy ops or not)
    assert executor_for(["Offload(a[1])"])[0] is jax_exec.stages.run
    with pytest.raises(TypeError, match="expected a schedule or a sequence of ops, got int"):
        jax_exec.run([], None, 3)

    class Foreign:
        ops = ()

    with pytest.raises(TypeError, match="no executor for Foreign"):
        jax_exec.run([], None, Foreign())


def test_chain_and_offload_results_agree_and_match_plain_autodiff(mlp):
    layers, x, y = mlp
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    schedule = solvers.solve(chain, 10**12, "store_all")
    chained = jax_exec.run(layers, mse_loss, schedule, x, y)
    as_offload = jax_exec.run(layers, mse_loss, OffloadSchedule(schedule.ops), x, y)
    assert type(chained) is type(as_offload) is jax_exec.RunResult
    assert chained.host_bytes == as_offload.host_bytes == ()  # host figures with copy ops only
    assert chained.resident_bytes == as_offload.resident_bytes
    assert chained.resident_bytes == schedir.simulate(chain, schedule).resident
    assert chained.op_temp_bytes == as_offload.op_temp_bytes
    loss, grads = plain_value_and_grad(layers, mse_loss)(x, y)
    for result in (chained, as_offload):
        np.testing.assert_allclose(result.loss, loss, rtol=1e-5)
        for got, want in zip(
            jax.tree_util.tree_leaves(result.grads), jax.tree_util.tree_leaves(grads), strict=True
        ):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_graph_schedule_dispatches_to_the_graph_runtime():
    nodes = residual_dag(1, 8, 16, 4, 2)
    inputs = {"x": jnp.ones((4, 4))}
    y = jnp.zeros((4, 2))
    graph = jax_exec.graph.profile_graph(nodes, mse_loss, inputs, y, timing="flops")
    schedule = solvers.solve(graph, 10**12, "store_all")
    via_run = jax_exec.run(nodes, mse_loss, schedule, inputs, y, graph=graph)
    direct = run_graph(nodes, mse_loss, graph, schedule, inputs, y)
    assert via_run.resident_bytes == direct.resident_bytes
    assert via_run.op_kernels == direct.op_kernels
    np.testing.assert_allclose(via_run.loss, direct.loss, rtol=1e-6)


def test_a_registered_executor_is_used_and_can_be_removed():
    class Toy(Schedule):
        pass

    seen = []

    def toy(model, loss_fn, schedule, *inputs, **options):
        seen.append((model, inputs, options))
        return jax_exec.RunResult(loss=1.0)

    jax_exec.executor.register(Toy, toy)
    try:
        assert jax_exec.run("m", None, Toy(()), 1, 2, flag=True).loss == 1.0
        assert seen == [("m", (1, 2), {"flag": True})]
    finally:
        jax_exec.executor.unregister(Toy)
    # without its own executor, a subclass of the chain Schedule runs as a chain
    assert executor_for(Toy(()))[0] is EXECUTORS[Schedule]
