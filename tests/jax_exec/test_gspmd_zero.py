"""plan_device's ZeRO stages through GSPMD on models sharded by their authors
(docs/device_memory.md, "Models sharded by their authors (GSPMD)").

In a subprocess with 8 CPU devices (XLA_FLAGS before JAX is imported): the FSDP MLP of
tests/jax_exec/test_sharded_models.py (``nnx.with_partitioning`` on a 4x2 ``data`` x
``model`` mesh, under ``jax.set_mesh``) planned by ``jax_exec.plan_device`` and run
(``DevicePlan.run``) under ZeRO stages 0-3 and stage 2 with the optimizer state on the
host: loss and gradients equal plain ``nnx.value_and_grad`` on the same sharded model
(tolerance relative to the largest leaf norm); parameters, gradients and optimizer
state placed as written out by hand here (the model's shardings kept, ZeRO's ``data``
axis added on the leaves it leaves whole); each device's measured bytes equal the
prediction and the hand count. A tensor-parallel MLP (``model`` only) under ZeRO-3:
``data`` joins ``model`` on one dimension. An unsharded model asked ``spmd="gspmd"``
runs on a plain ``data`` mesh. Every budget form on both paths. The sharding rule's
functions are checked in this process."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from xla_env import device_flags

import jax_exec
from jax_exec.zero_layout import opt_state_specs, placed_spec, tensors
from schedir.budget import BudgetError, parse_budget
from schedir.training_state import Tensor

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import warnings
from dataclasses import replace
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
import jax_exec
from schedir.budget import parse_budget
from schedir.training_state import device_bytes

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
init = nnx.initializers.lecun_normal()


class MLP(nnx.Module):
    def __init__(self, a, b, rngs):
        self.a = nnx.Linear(32, 64, kernel_init=nnx.with_partitioning(init, a), rngs=rngs)
        self.b = nnx.Linear(64, 32, kernel_init=nnx.with_partitioning(init, b), rngs=rngs)

    def __call__(self, x):
        return self.b(jax.nn.gelu(self.a(x)))


def mse(m, x, y):
    return jnp.mean((m(x) - y) ** 2)


def close(a, b):
    scale = max(float(jnp.linalg.norm(w)) for w in jax.tree.leaves(b)) or 1.0
    for g, w in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert float(jnp.linalg.norm(g - w)) <= 1e-5 * scale


def placed(tree, specs):
    # leaf order of an nnx.State of the MLP: a.bias, a.kernel, b.bias, b.kernel
    for x, spec in zip(jax.tree.leaves(tree), specs, strict=True):
        want = NamedSharding(mesh, spec, memory_kind=x.sharding.memory_kind)  # (below)
        assert x.sharding.is_equivalent_to(want, x.ndim), (x.sharding, spec)


def as_chosen(dp, alt):
    # the plan as if it had chosen this alternative (its own step and activation plan)
    return replace(dp, strategy=alt.strategy, step=alt.step, activation_plan=alt.activation_plan)


adam = optax.adam(0.1)
x = jnp.linspace(-1, 1, 512).reshape(16, 32)
y = jnp.zeros((16, 32))
with jax.set_mesh(mesh):
    fsdp = MLP(("data", "model"), ("model", "data"), nnx.Rngs(0))
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    loss, grads = nnx.jit(nnx.value_and_grad(mse))(fsdp, xs, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plan's: activation bytes are the whole step's
        dp = jax_exec.plan_device(mse, fsdp, xs, y, budget="150%", optimizer=adam,
                                  data_parallel=4, exact=False)
    assert dp.spmd == "gspmd" and dp.traced_mesh == {"data": 4, "model": 2}
    ref = dp.reference_bytes
    for form in (ref * 3 // 2, f"{ref * 3 / 2 / 1024} KiB", "150%"):  # every budget form
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # data_parallel: the mesh's data axis
            again = jax_exec.plan_device(mse, fsdp, xs, y, budget=form, optimizer=adam,
                                         exact=False)  # fmt: skip
        got = again.budget
        assert again.data_parallel == 4, again.data_parallel
        assert got == parse_budget(form, ref) and got in (ref * 3 // 2, dp.budget), form
    assert "GSPMD on the mesh" in dp.summary() and "ZeRO-3 splits 2 more" in dp.summary()
    kernels = [P("data", "model"), P("model", "data")]
    whole, split = P(None), P("data")
    by_name = {a.strategy.name: a for a in dp.alternatives}
    for name in ("ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-2 +offload"):
        alt = by_name[name]
        stage, p = alt.strategy.stage, alt.strategy.placement
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            run = as_chosen(dp, alt).run(fsdp, xs, y, mesh=mesh)
        said = [str(w.message) for w in seen if "keeps parameters replicated" in str(w.message)]
        assert bool(said) == (stage < 3) and (not said or "['a']['kernel']" in said[0]), said
        assert abs(float(run.loss) - float(loss)) <= 1e-6 * abs(float(loss)), name
        close(run.grads, grads)
        # by hand: the kernels keep the model's shardings; the biases as the stage says
        bias = lambda sharded: split if sharded else whole
        placed(run.state.params, [bias(stage >= 3), kernels[0], bias(stage >= 3), kernels[1]])
        placed(run.grads, [bias(stage >= 2), kernels[0], bias(stage >= 2), kernels[1]])
        mu = [bias(stage >= 1), kernels[0], bias(stage >= 1), kernels[1]]
        placed(run.state.opt_state, [P()] + mu + mu)  # count, mu, nu
        kinds = {o.sharding.memory_kind for o in jax.tree.leaves(run.state.opt_state)}
        assert kinds == {"pinned_host" if p.opt_state == "host" else "device"}, kinds
        want = device_bytes(dp.params, dp.opt_state, p, 4)
        for part in ("params", "grads", "opt_state", "host"):
            assert set(run.measured[part].values()) == {getattr(want, part)}, (name, part)
        assert run.state_bytes == alt.step.state.resident == want.resident
        # by hand: a kernel is 32 x 64 float32 over 8 devices, a bias over 4 or whole
        biases = lambda sharded: (64 + 32) * 4 // (4 if sharded else 1)
        assert want.params == 2 * 1024 + biases(stage >= 3)
        assert want.grads == 2 * 1024 + biases(stage >= 2)
        moments = 2 * (2 * 1024 + biases(stage >= 1))
        assert (want.opt_state, want.host) == ((0, 4 + moments) if p.opt_state == "host"
                                               else (4 + moments, 0))
    # the plan's own choice runs too (made exact first), and trains on
    run = dp.run(fsdp, xs, y, mesh=mesh)
    close(run.grads, grads)
    before = [x.sharding for x in jax.tree.leaves(run.state)]
    state, loss2 = run.zero_step(run.state, (xs, y))
    assert np.isfinite(float(loss2)) and float(loss2) != float(loss)
    assert all(x.sharding == s for x, s in zip(jax.tree.leaves(state), before, strict=True))

    # tensor parallelism only: ZeRO-3 adds 'data' next to 'model' on one dimension
    tp = MLP((None, "model"), ("model", None), nnx.Rngs(1))
    loss, grads = nnx.jit(nnx.value_and_grad(mse))(tp, xs, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = jax_exec.plan_device(mse, tp, xs, y, budget="150%", optimizer=adam,
                                  data_parallel=4, exact=False)
    assert "the model shards 0 of 4" in dp.summary()
    alt = next(a for a in dp.alternatives if a.strategy.name == "ZeRO-3")
    run = as_chosen(dp, alt).run(tp, xs, y, mesh=mesh)
    close(run.grads, grads)
    placed(run.state.params, [P("data"), P("data", "model"), P("data"), P(("model", "data"))])
    want = device_bytes(dp.params, dp.opt_state, alt.strategy.placement, 4)
    assert want.params == 2 * 1024 + 96  # by hand: the kernels over 8 devices, biases over 4
    assert set(run.measured["params"].values()) == {want.params}

    # what cannot hold is refused, naming it
    for kwargs, words in (({"spmd": "shard_map"}, "spmd = 'shard_map'"),
                          ({"data_parallel": 2}, "a 'data' axis of 4"),
                          ({"spmd": "gspmd2"}, "spmd = 'gspmd2'")):  # fmt: skip
        try:
            jax_exec.plan_device(mse, fsdp, xs, y, **{"budget": "150%", "optimizer": adam,
                                 "data_parallel": 4, "exact": False, **kwargs})
        except ValueError as err:
            assert words in str(err), err
        else:
            raise AssertionError(kwargs)
    other = jax.make_mesh((4, 2), ("data", "other"))
    try:
        dp.run(tp, xs, y, mesh=other)
    except ValueError as err:
        assert "planned on a mesh" in str(err), err
    else:
        raise AssertionError("ran on another mesh")

# an unsharded model asked for GSPMD: the plain data mesh, the rule alone
plain = nnx.Sequential(nnx.Linear(32, 64, rngs=nnx.Rngs(2)), nnx.Linear(64, 32, rngs=nnx.Rngs(3)))
loss, grads = nnx.value_and_grad(mse)(plain, x, y)
dp = jax_exec.plan_device(mse, plain, x, y, budget="150%", optimizer=adam, data_parallel=4,
                          exact=False, spmd="gspmd")
assert dp.spmd == "gspmd" and dp.traced_mesh == {}
run = as_chosen(dp, next(a for a in dp.alternatives if a.strategy.name == "ZeRO-3")).run(
    plain, x, y)
close(run.grads, grads)
want = device_bytes(dp.params, dp.opt_state, run.plan.strategy.placement, 4)
assert set(run.measured["params"].values()) == {want.params}
print("ok")
"""

SCANNED = r"""
import warnings
from dataclasses import replace
import jax, jax.numpy as jnp, optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
import jax_exec
from schedir.training_state import device_bytes


class Scanned(nnx.Module):  # a stack of layers under nnx.scan
    def __init__(self, depth, dim, rngs):
        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def layers(rngs):
            return nnx.Linear(dim, dim, rngs=rngs)

        self.layers = layers(rngs)
        self.head = nnx.Linear(dim, 8, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def run(layer, x):
            return jnp.tanh(layer(x))

        return self.head(run(self.layers, x))


def mse(m, x, y):
    return jnp.mean((m(x) - y) ** 2)


mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
model = Scanned(6, 64, nnx.Rngs(0))
x, y = jax.random.normal(jax.random.key(1), (32, 64)), jnp.zeros((32, 8))
# FSDP by hand, outside any jax.set_mesh: each matrix's last axis over data
params = nnx.state(model, nnx.Param)
spec = lambda a: P(*[None] * (a.ndim - 1), "data") if a.ndim >= 2 else P()
nnx.update(model, jax.device_put(params, jax.tree.map(lambda a: NamedSharding(mesh, spec(a)),
                                                      params)))
loss, grads = nnx.value_and_grad(mse)(model, x, y)
scale = max(float(jnp.linalg.norm(w)) for w in jax.tree.leaves(grads))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dp = jax_exec.plan_device(mse, model, x, y, budget="150%", optimizer=optax.adam(0.1),
                              data_parallel=4, exact=False)
assert dp.spmd == "gspmd" and dp.traced_mesh == {"data": 4, "model": 2}
stages = [a for a in dp.alternatives if a.strategy.name in ("ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
assert [a.strategy.stage for a in stages] == [0, 1, 2, 3] and all(a.fits for a in stages)
for alt in stages:  # (stage 3 of a scanned stack: the shard_map path refuses it)
    chosen = replace(dp, strategy=alt.strategy, step=alt.step,
                     activation_plan=alt.activation_plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = chosen.run(model, x, y)
    assert abs(float(run.loss) - float(loss)) <= 1e-6 * abs(float(loss))
    for g, w in zip(jax.tree.leaves(run.grads), jax.tree.leaves(grads), strict=True):
        assert float(jnp.linalg.norm(g - w)) <= 1e-5 * scale
    want = device_bytes(dp.params, dp.opt_state, alt.strategy.placement, 4)
    for part in ("params", "grads", "opt_state"):
        assert set(run.measured[part].values()) == {getattr(want, part)}, (alt, part)
# by hand under ZeRO-3: the stacked kernel and bias, the head's kernel over 4; its bias too
assert want.params == (6 * 64 * 64 + 6 * 64 + 64 * 8 + 8) * 4 // 4
print("ok")
"""


def _run(script: str) -> None:
    env = dict(os.environ, XLA_FLAGS=device_flags(8), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )


def test_zero_stages_through_gspmd_on_an_fsdp_model():
    _run(SCRIPT)


@pytest.mark.slow
def test_a_scanned_stack_sharded_by_hand_under_every_stage():
    """A model sharded with jax.device_put (no jax.set_mesh) whose layers are an
    nnx.scan stack: planned through GSPMD, every stage (ZeRO-3 too, which the shard_map
    path refuses for a scanned stack) equals plain, bytes as predicted."""
    _run(SCANNED)


def test_the_sharding_rule_combined_with_the_model_s():
    mesh = {"data": 4, "model": 2}
    assert placed_spec(P(), (10, 16), mesh, True) == P(None, "data")  # the rule alone
    assert placed_spec(P(), (10, 16), mesh, False) == P(None, None)
    assert placed_spec(P(), (13,), mesh, True) == P(None)  # no axis: whole
    assert placed_spec(P("data", "model"), (32, 64), mesh, False) == P("data", "model")
    # 'data' next to 'model' on the first dimension whose piece N divides
    assert placed_spec(P("model", None), (8, 6), mesh, True) == P(("model", "data"), None)
    assert placed_spec(P("model", None), (4, 8), mesh, True) == P("model", "data")
    got = tensors([jax.ShapeDtypeStruct((32, 64), jnp.float32)], [P("model", "data")], mesh)
    assert got == (Tensor((16, 64), 4, data_axis=1),)


def test_optimizer_state_follows_its_parameter():
    model = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.Linear(8, 8, rngs=nnx.Rngs(1)))
    params = nnx.state(model, nnx.Param)
    specs = [P(f"s{i}") for i in range(len(jax.tree.leaves(params)))]
    opt = jax.eval_shape(optax.adamw(1e-3).init, params)
    got = opt_state_specs(opt, params, specs)
    assert got == [P()] + specs + specs  # the step count has none; mu, nu their parameter's


@pytest.mark.parametrize("spmd", ["shard_map", "gspmd"])
def test_every_budget_form_on_both_paths(spmd):
    """The shard_map path, and the GSPMD path (asked for, on one device here; the
    script above plans the FSDP model in bytes, units and percentages): ints, whole
    floats, Fractions, units and percentages give the bytes parse_budget gives."""
    model = nnx.Sequential(nnx.Linear(8, 16, rngs=nnx.Rngs(0)), nnx.Linear(16, 3, rngs=nnx.Rngs(1)))
    x, y = jnp.ones((4, 8)), jnp.zeros((4, 3))

    def mse(m, x, y):
        return jnp.mean((m(x) - y) ** 2)

    def plan(budget):
        return jax_exec.plan_device(mse, model, x, y, budget=budget, optimizer=optax.sgd(0.1),
                                    exact=False, spmd=spmd)  # fmt: skip

    full = plan("100%")
    assert full.spmd == spmd
    ref, b = full.reference_bytes, full.reference_bytes * 2
    for form in (b, float(b), Fraction(b), str(b), f"{b} B", f"{b / 1024} KiB", f"{b / 1000} kB",
                 "200%", "150.5%"):  # fmt: skip
        assert plan(form).budget == parse_budget(form, ref), form
    for bad in ("12 parsecs", -1, "device"):  # CPU reports no memory: give bytes
        with pytest.raises(BudgetError, match="budget"):
            plan(bad)
    assert plan(b).strategy == plan(f"{b / 2**20} MiB").strategy
