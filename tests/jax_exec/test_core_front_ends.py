"""One execution core under both front ends: the same layers as a stage list
(``jax_exec.stages``) and inside a Flax NNX model traced as the planner traces any model
(``jax_exec.program.trace``), cut after every layer, become the same step program, and
the core runs a schedule on both with the same ops, bytes and gradients (op by op and
compiled). (The planner cuts a model where the fewest bytes cross, here also inside the
loss: the stage list's rule, a cut after every marked layer, makes the two programs
comparable block by block.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import jax_exec
import schedir
import solvers
from jax_exec.execute import lower, run_schedule
from jax_exec.program.build import program_model
from jax_exec.program.problem import build_problem
from jax_exec.program.trace import split_model, trace
from jax_exec.stages.program import BOUNDARY, layer_cuts, plain_options
from schedir.blocks.schedule import BlockSchedule


class Stack(nnx.Module):
    """The layers applied in order, each output marked as the stage list marks it."""

    def __init__(self, layers):
        self.layers = nnx.List(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = checkpoint_name(layer(x), BOUNDARY)
        return x


def mse(out, y):
    return jnp.mean((out - y) ** 2)


@pytest.fixture(scope="module")
def case():
    rngs = nnx.Rngs(0)
    layers = [nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs),
              nnx.Linear(16, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs)]  # fmt: skip
    x = jax.random.normal(jax.random.key(1), (4, 8))
    y = jax.random.normal(jax.random.key(2), (4, 4))
    return layers, x, y


def test_a_stage_list_and_a_traced_model_run_alike(case):
    layers, x, y = case
    step = jax_exec.stages.stage_step(layers, mse, x, y)
    model = Stack(layers)
    traced = program_model(trace(lambda m, x, y: mse(m(x), y), model, (x, y)),
                           cuts=layer_cuts, options=plain_options)  # fmt: skip
    traced.compile(traced.every_kernel())
    traced.problem = build_problem(traced)
    assert traced.length == step.length == len(layers)
    assert traced.problem == step.model.problem  # the same block chain, to the byte
    chain = step.model.problem.to_chain([0] * step.length)
    store_all = schedir.simulate(chain, solvers.solve(chain, 10**9, "store_all")).peak_memory
    least = solvers.chain.rotor.min_memory(chain)
    schedule = solvers.solve(chain, (least + store_all) // 2, method="rotor")
    assert any(isinstance(op, schedir.F_ck) for op in schedule.ops)  # it recomputes
    by_stages = step.run(schedule, x, y)
    _, params, rest = split_model(model)
    on_traced = BlockSchedule(schedule.ops, {}, (0,) * traced.length)
    by_model = run_schedule(traced, on_traced, params, rest, (x, y))
    assert by_stages.ops == by_model.ops
    assert by_stages.resident_bytes == by_model.resident_bytes
    assert by_stages.op_peak_bytes == by_model.op_peak_bytes
    np.testing.assert_allclose(by_stages.loss, by_model.loss, rtol=1e-6)
    stage_grads = jax.tree.leaves(by_stages.grads)  # one pytree per layer
    model_grads = jax.tree.leaves(by_model.grads)  # the model's nnx.State
    for g, w in zip(stage_grads, model_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    (loss, _), grads = jax.value_and_grad(lower(traced, on_traced), has_aux=True)(
        params, rest, (x, y)
    )
    np.testing.assert_allclose(loss, by_stages.loss, rtol=1e-6)
    for g, w in zip(jax.tree.leaves(grads), stage_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_the_graph_interpreter_runs_any_graph_program():
    """The one graph interpreter (``run_graph_ops``) needs only a ``GraphProgram``: here
    a graph of two plain ``jnp`` ops, one of which makes an array it drops. Measured
    bytes and needs equal the simulator's; the caller's input survives its ``Free``."""
    from jax_exec.execute.graph import Computed, node_arrays, run_graph_ops
    from jax_exec.execute.result import OpMeter
    from schedir.graph import build_graph

    x = jnp.arange(4.0)  # 16 bytes
    graph = build_graph([
        {"name": "x", "kind": "input", "cost": 0, "size": 16},
        {"name": "y", "cost": 1, "size": 16, "inputs": ["x"]},
        {"name": "z", "cost": 1, "size": 16, "inputs": ["x", "y"], "tmp": 16},
    ])  # fmt: skip

    class Program:
        def inputs(self):
            return {0: {"x": x}}

        def compute(self, i, buf):
            a = node_arrays(buf, 0)["x"]
            if i == 1:
                return Computed({"y": a * 2}, 0, "double")
            dropped = a + 1  # made and dropped: counted in the need (the node's tmp)
            return Computed({"z": a + node_arrays(buf, 1)["y"]}, 0, "add", dropped=(dropped,))

        def result(self, meter: OpMeter, ops):
            return meter.result(ops=ops)

    ops = schedir.GraphSchedule(("Compute(1)", "Compute(2)", "Free(1)", "Free(0)")).ops
    result = run_graph_ops(Program(), graph, ops)
    trace = schedir.simulate_graph(graph, ops)
    assert result.resident_bytes == trace.resident
    assert result.op_peak_bytes == trace.op_peak
    assert result.op_kernels == ("double", "add", None, None)
    assert not x.is_deleted()
