"""jax_exec: profiling details, bad input, Linen layers."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_exec
import schedir
import solvers
from schedir_cli.models import mlp_stack, mse_loss

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)

F_ck, F_n, F_all, B, Loss = schedir.F_ck, schedir.F_n, schedir.F_all, schedir.B, schedir.Loss


@pytest.fixture(scope="module")
def small():
    layers = mlp_stack(depth=2, width=16, hidden=32, in_dim=8, out_dim=4, seed=3)
    x = jax.random.normal(jax.random.key(0), (8, 8))
    y = jax.random.normal(jax.random.key(1), (8, 4))
    return layers, x, y


def test_profile_sizes_and_flops_timing(small):
    layers, x, y = small
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    assert chain.length == 4
    # a[0] is empty: the batch is an argument of the step, not an activation
    assert chain.in_size == (0, 8 * 16 * 4, 8 * 16 * 4, 8 * 16 * 4, 8 * 4 * 4)
    # A linear stage saves only its output (its vjp needs the input and the kernel).
    assert chain.saved_size[0] == chain.in_size[1]
    assert chain.saved_size[3] == chain.in_size[4]
    # An MLP block saves more than its output: LayerNorm and GELU residuals.
    assert chain.saved_size[1] > chain.in_size[2]
    assert chain.fwd_time[-1] == 0.0 and chain.saved_size[-1] == 0
    assert all(t > 0 for t in chain.fwd_time[:-1]) and all(t > 0 for t in chain.bwd_time)
    again = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops", flops_per_second=1e10)
    assert again == chain  # deterministic
    assert schedir.from_dict(chain.to_dict()) == chain  # profiles are plain JSON


def test_profile_measured_times(small):
    layers, x, y = small
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="measure", repeats=3)
    assert all(t > 0 for t in chain.fwd_time[:-1]) and all(t > 0 for t in chain.bwd_time)
    flops = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    assert chain.in_size == flops.in_size and chain.saved_size == flops.saved_size


def test_bad_timing(small):
    layers, x, y = small
    with pytest.raises(ValueError, match="timing"):
        jax_exec.stages.profile(layers, mse_loss, x, y, timing="guess")


class TupleOut(nnx.Module):
    def __call__(self, x):
        return x, x


def test_layer_output_not_an_array(small):
    layers, x, y = small
    bad = [*layers[:2], TupleOut(), *layers[2:]]
    with pytest.raises(TypeError, match=r"layer 2:TupleOut's output is a tuple, not an array"):
        jax_exec.stages.profile(bad, mse_loss, x, y)
    ops = solvers.solve(
        schedir.Chain.from_rotor([1.0] * 5, [1.0] * 6, [1] * 6, [1] * 6, [0] * 5, [0] * 6),
        100,
        "store_all",
    )
    with pytest.raises(TypeError, match="not an array"):
        jax_exec.run(bad, mse_loss, ops, x, y)


def test_not_a_layer():
    with pytest.raises(TypeError, match="layer 0: got function .*<lambda>: a function of your own"):
        jax_exec.stages.as_stages([lambda a: a])
    with pytest.raises(TypeError, match="layer 1: got int 3: expected an nnx.Module"):
        jax_exec.stages.as_stages([jax.nn.relu, 3])


def test_loss_must_be_scalar(small):
    layers, x, y = small
    with pytest.raises(TypeError, match="scalar"):
        jax_exec.stages.profile(layers, lambda out, y: out - y, x, y)


def test_budget_below_minimum(small):
    layers, x, y = small
    with pytest.raises(solvers.Infeasible, match="minimum feasible budget is") as info:
        jax_exec.stages.plan(layers, mse_loss, x, y, budget=100, method="rotor", timing="flops")
    assert info.value.min_budget > 100
    chain, schedule = jax_exec.stages.plan(
        layers, mse_loss, x, y, budget=info.value.min_budget * 2, timing="flops"
    )
    assert schedir.simulate_chain(chain, schedule).peak_memory <= info.value.min_budget * 2


def test_schedule_for_another_chain_length(small):
    layers, x, y = small
    longer = [*(F_all(k) for k in range(6)), Loss(), *(B(k) for k in range(5, -1, -1))]
    shorter = [F_all(0), F_all(1), Loss(), B(1), B(0)]
    for ops, n in ((longer, 6), (shorter, 2)):
        message = rf"schedule is for a chain of {n} stages, but the model has 4 layers"
        with pytest.raises(schedir.InvalidSchedule, match=message):
            jax_exec.run(layers, mse_loss, ops, x, y)
        with pytest.raises(schedir.InvalidSchedule, match=message):
            jax_exec.stages.value_and_grad(layers, mse_loss, ops)


def test_invalid_schedule_names_the_op(small):
    layers, x, y = small
    ops = [F_all(0), F_all(1), F_all(2), F_all(3), Loss(), B(3), B(1), B(2), B(0)]
    with pytest.raises(schedir.InvalidSchedule, match=r"op 6: B\(1\)"):
        jax_exec.run(layers, mse_loss, ops, x, y)


class LinenBlock(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(self.width)(jnp.tanh(nn.Dense(2 * self.width)(x)))


def test_linen_layers():
    x = jax.random.normal(jax.random.key(0), (8, 16))
    y = jax.random.normal(jax.random.key(1), (8, 16))
    modules = [LinenBlock(16) for _ in range(3)]
    keys = jax.random.split(jax.random.key(2), 3)
    layers = [(m, m.init(k, x)) for m, k in zip(modules, keys, strict=True)]

    def plain(params, x, y):
        a = x
        for m, p in zip(modules, params, strict=True):
            a = m.apply({"params": p}, a)
        return mse_loss(a, y)

    params = [v["params"] for _, v in layers]
    want_loss, want = jax.value_and_grad(plain)(params, x, y)
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    full = solvers.solve(chain, 10**12, "store_all").meta["peak_memory"]
    with pytest.raises(solvers.Infeasible) as info:
        solvers.solve(chain, 1, "rotor")
    schedule = solvers.solve(chain, (full + info.value.min_budget) // 2, "rotor")
    assert any(isinstance(op, F_ck) for op in schedule.ops)  # it does recompute
    trace = schedir.simulate_chain(chain, schedule)
    result = jax_exec.run(layers, mse_loss, schedule, x, y)
    assert result.resident_bytes == trace.resident
    loss, grads = jax_exec.stages.value_and_grad(layers, mse_loss, schedule)(x, y)
    for got_loss, got in ((result.loss, result.grads), (loss, grads)):
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class LinenNormed(nn.Module):
    train: bool = False

    @nn.compact
    def __call__(self, x):
        return nn.BatchNorm(use_running_average=not self.train)(nn.Dense(8)(x))


def test_linen_state_read_at_call_time_shared_arrays_and_training_refused():
    x = jax.random.normal(jax.random.key(0), (4, 8))
    y = jax.random.normal(jax.random.key(1), (4, 8))
    module = LinenNormed()
    variables = module.init(jax.random.key(2), x)
    ops = [F_all(0), Loss(), B(0)]
    step = jax_exec.stages.value_and_grad([(module, variables)], mse_loss, ops)
    step(x, y)
    variables["batch_stats"] = jax.tree.map(lambda v: v + 1.0, variables["batch_stats"])

    def plain(params):
        return mse_loss(module.apply({**variables, "params": params}, x), y)

    want_loss, want = jax.value_and_grad(plain)(variables["params"])
    loss, grads = step(x, y)
    result = jax_exec.run([(module, variables)], mse_loss, ops, x, y)
    for got_loss, got in ((loss, grads), (result.loss, result.grads)):
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="hold the same parameter array"):
        jax_exec.stages.profile([(module, variables), (module, variables)], mse_loss, x, y)
    training = LinenNormed(train=True)
    with pytest.raises(Exception, match="batch_stats.*immutable"):
        jax_exec.run([(training, variables)], mse_loss, ops, x, y)
