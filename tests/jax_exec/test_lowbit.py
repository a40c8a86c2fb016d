"""Low-bit activation storage (jax_exec/auto/lowbit.py): the codecs against hand-computed
values, the compressed residuals in both executors (the op-by-op runtime's measured
peak equals the plan's; the compiled step saves the compressed arrays the plan
expects), the reported gradient error equal to the one measured here and within the
tolerance, and no low-bit option at all with tolerance 0."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_exec
from jax_exec.auto import lowbit
from jax_exec.execute.lowering import expected_residuals, saved_residuals


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(3)])
        self.norm = nnx.LayerNorm(16, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = x + jnp.tanh(layer(self.norm(x)))
        return x


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


X = jax.random.normal(jax.random.key(0), (16, 16))
Y = jnp.zeros((16, 16))


def _flat(tree):
    return np.concatenate(
        [np.ravel(np.asarray(u, np.float64)) for u in jax.tree_util.tree_leaves(tree)]
    )


def test_codecs():
    x = jnp.array([-2.0, 0.5, 1.0, 0.0])
    q, scale = lowbit.encode(x, "int8")
    assert q.dtype == jnp.int8 and float(scale) == pytest.approx(2.0 / 127)
    assert q.tolist() == [-127, 32, 64, 0]  # round(0.5 * 63.5) = 32 (half to even)
    assert np.allclose(
        lowbit.decode((q, scale), jnp.float32, "int8"), [-2.0, 32 * 2 / 127, 64 * 2 / 127, 0]
    )
    q, scale = lowbit.encode(x, "float8_e4m3fn")
    assert q.dtype == jnp.float8_e4m3fn and float(scale) == pytest.approx(2.0 / 448)
    assert np.allclose(lowbit.decode((q, scale), jnp.float32, "float8_e4m3fn"), x, rtol=2**-3)
    zero = lowbit.encode(jnp.zeros(3), "int8")
    assert float(zero[1]) == 1.0 and not np.any(
        np.asarray(lowbit.decode(zero, jnp.float32, "int8"))
    )
    (b,) = lowbit.encode(x, "bfloat16")
    assert b.dtype == jnp.bfloat16
    spec = jax.ShapeDtypeStruct
    assert lowbit.compressible(spec((8, 8), jnp.float32), "int8")
    assert not lowbit.compressible(spec((8, 8), jnp.int32), "int8")  # integer: never
    assert not lowbit.compressible(spec((), jnp.float32), "int8")  # a scalar: no gain
    assert not lowbit.compressible(spec((8,), jnp.bfloat16), "bfloat16")  # not wider
    with pytest.raises(ValueError, match="storage"):
        lowbit.LowBitOption("names", storage="int4")


def test_tolerance_zero_never_stores_low_bit():
    model = MLP(nnx.Rngs(0))
    kw = dict(budget="60%", exact=False)
    for p in (jax_exec.plan(loss_fn, model, X, Y, activation_tolerance=0, **kw),
              jax_exec.plan(loss_fn, model, X, Y, **kw)):  # fmt: skip
        assert not isinstance(p.model, lowbit.LowBitModel) and "lowbit" not in p.schedule.meta
        assert not any(isinstance(o, lowbit.LowBitOption) for opts in p.model.options for o in opts)
    with pytest.raises(ValueError, match="activation_tolerance"):
        jax_exec.plan(loss_fn, model, X, Y, budget="60%", activation_tolerance=-1.0, exact=False)
    with pytest.raises(ValueError, match="activation_storages"):
        jax_exec.plan(loss_fn, model, X, Y, budget="60%", activation_storages=("int8",))


def test_low_bit_plan_runs_exactly_and_reports_its_error():
    model = MLP(nnx.Rngs(0))
    tolerance = 2e-2
    full = jax_exec.plan(loss_fn, model, X, Y, budget="100%", exact=False)
    p = full.replan(full.least_budget() * 11 // 10)  # tight for full precision
    lb = jax_exec.plan(loss_fn, model, X, Y, budget=p.budget, activation_tolerance=tolerance,
                       activation_storages=("int8",), exact=False)  # fmt: skip
    assert any(lb.schedule.meta["lowbit"]["storage"])  # tight: compression helps here
    assert lb.overhead <= p.overhead + 1e-12  # more options, same figures: never slower
    result = lb.run(model, X, Y)  # exact first, then op by op: measured peak = prediction
    assert result.peak_bytes == lb.schedule.meta["peak_memory"] <= lb.budget
    report = lb.schedule.meta["lowbit"]
    assert 0 <= report["gradient_error"] <= tolerance
    assert (report["saved_bytes"] > 0) == any(report["storage"])
    for storage, (error, residual) in report["screen"].items():  # every block compressed
        if storage is not None:
            assert residual < report["screen"][None][1] and error > 0
    result = lb.run(model, X, Y)  # op by op: measured peak = prediction, within budget
    assert result.peak_bytes == lb.schedule.meta["peak_memory"] <= lb.budget
    ref = _flat(nnx.jit(nnx.grad(loss_fn))(model, X, Y))
    err = np.linalg.norm(_flat(result.grads) - ref) / np.linalg.norm(ref)
    assert err == pytest.approx(report["gradient_error"], rel=1e-2, abs=1e-6)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    fn = lb.lowered()  # compiled: the custom_vjp keeps the compressed arrays
    saved = saved_residuals(fn, params, rest, (X, Y))
    assert saved == expected_residuals(lb.model, lb.schedule)
    assert any(dtype == "int8" for _, dtype in saved) == any(report["storage"])
