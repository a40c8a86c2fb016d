"""The whole device's planner (jax_exec.plan_device) on one CPU device: bad
input refused by name, min_budget the least budget at which a strategy fits (it plans
there, one byte less raises), and planning for N devices needs none of them (the
8-device execution is in test_zero_jax.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jax_exec
import solvers


class Net(nnx.Module):
    def __init__(self, rngs):
        self.a = nnx.Linear(8, 32, rngs=rngs)
        self.b = nnx.Linear(32, 32, rngs=rngs)
        self.c = nnx.Linear(32, 3, rngs=rngs)

    def __call__(self, x):
        return self.c(jnp.tanh(self.b(jnp.tanh(self.a(x)))))


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


X, Y = jax.random.normal(jax.random.key(0), (16, 8)), jnp.zeros((16, 3))
KW = dict(optimizer=optax.adamw(1e-3), exact=False)


def test_bad_input_is_refused_by_name():
    model = Net(nnx.Rngs(0))
    with pytest.raises(TypeError, match="optimizer"):
        jax_exec.plan_device(loss_fn, model, X, Y, budget=10**6, optimizer="adam")
    with pytest.raises(ValueError, match="data_parallel"):
        jax_exec.plan_device(loss_fn, model, X, Y, budget=10**6, data_parallel=0, **KW)
    with pytest.raises(ValueError, match=r"args\[0\].*data_parallel = 3"):
        jax_exec.plan_device(loss_fn, model, X, Y, budget=10**6, data_parallel=3, **KW)
    with pytest.raises(ValueError, match="budget = '50 apples'"):
        jax_exec.plan_device(loss_fn, model, X, Y, budget="50 apples", **KW)
    with pytest.raises(ValueError, match="not an nnx.Param"):
        jax_exec.plan_device(lambda m, x: m(x).mean(), nnx.BatchNorm(8, rngs=nnx.Rngs(0)), X,
                      budget=10**6, **KW)  # fmt: skip


def test_budgets_in_units_and_percentages():  # one parser: schedir.budget
    model = Net(nnx.Rngs(0))
    wide = jax_exec.plan_device(loss_fn, model, X, Y, budget="1GiB", **KW)
    assert wide.budget == 2**30
    half = jax_exec.plan_device(loss_fn, model, X, Y, budget="100%", **KW)
    assert half.budget == half.reference_bytes


def test_min_budget_is_the_least_budget_that_plans():
    model = Net(nnx.Rngs(0))
    wide = jax_exec.plan_device(loss_fn, model, X, Y, budget=10**9, data_parallel=4, **KW)
    least = wide.min_budget
    assert least == min(a.min_budget for a in wide.alternatives)
    tight = jax_exec.plan_device(loss_fn, model, X, Y, budget=least, data_parallel=4, **KW)
    assert tight.step.peak_bytes <= least and tight.strategy.name == "ZeRO-3 +offload"
    with pytest.raises(solvers.Infeasible) as err:
        jax_exec.plan_device(loss_fn, model, X, Y, budget=least - 1, data_parallel=4, **KW)
    assert err.value.min_budget == least
    for alt in wide.alternatives:  # each strategy's parts add up
        s = alt.step
        assert s.peak_bytes == s.state.resident + s.buffers + max(s.activation_peak, s.update_bytes)
    best = min(a.step.step_time for a in wide.alternatives)
    assert wide.step.step_time == best and "ZeRO" in wide.table()


def test_one_device_keeps_data_parallelism_when_it_fits():
    model = Net(nnx.Rngs(0))
    p = jax_exec.plan_device(loss_fn, model, X, Y, budget=10**9, **KW)
    assert p.strategy.name == "ZeRO-0" and p.step.collective_bytes == 0
    # parameters, gradients, Adam's mu and nu, and its int32 step count
    assert p.step.state.resident == 4 * sum(t.nbytes for t in p.params) + 4


def test_low_bit_storage_only_with_a_tolerance():
    from jax_exec.auto.lowbit import LowBitModel

    model = Net(nnx.Rngs(0))
    plain = jax_exec.plan_device(loss_fn, model, X, Y, budget=10**9, data_parallel=2, **KW)
    assert not isinstance(plain.activation_plan.model, LowBitModel)
    least = plain.min_budget
    low = jax_exec.plan_device(loss_fn, model, X, Y, budget=least, data_parallel=2,
                        activation_tolerance=5e-2, activation_storages=("bfloat16",),
                        **KW)  # fmt: skip
    report = low.activation_plan.schedule.meta["lowbit"]
    assert report["gradient_error"] <= 5e-2 and low.min_budget <= least
    assert "low-bit activations" in low.summary()


def test_exact_plans_price_the_choice_with_compiled_kernels():
    model = Net(nnx.Rngs(0))
    kw = dict(optimizer=optax.adamw(1e-3), data_parallel=2)
    p = jax_exec.plan_device(loss_fn, model, X, Y, budget=10**9, **kw)
    chosen = next(a for a in p.alternatives if a.strategy == p.strategy)
    assert p.exact and chosen.exact and p.activation_plan.exact
    tight = jax_exec.plan_device(loss_fn, model, X, Y, budget=p.min_budget, **kw)
    assert tight.step.peak_bytes <= p.min_budget
    with pytest.raises(solvers.Infeasible) as err:
        jax_exec.plan_device(loss_fn, model, X, Y, budget=p.min_budget - 1, **kw)
    assert err.value.min_budget == p.min_budget
