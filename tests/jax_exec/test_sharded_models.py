"""A model sharded the way Flax users shard it (``nnx.with_partitioning`` on a 4x2 mesh,
FSDP-style, under ``jax.set_mesh``; a batch sharded over the data axis) through the
drop-in: the plan says (a warning, ``Plan.sharded_devices``, the summary) that its
bytes are the whole step's; the compiled step under ``nnx.jit`` and eagerly gives plain
``nnx.value_and_grad``'s loss and gradients with the same shardings; the op-by-op
runtime gathers the arrays on one device (with a warning) and gives the same figures;
the device planner's ZeRO step runs it through GSPMD with plain's gradients. Run in a
subprocess with 8 CPU devices (XLA_FLAGS before JAX is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from xla_env import device_flags

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import warnings
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
import jax_exec

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
init = nnx.initializers.lecun_normal()


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.a = nnx.Linear(32, 64, kernel_init=nnx.with_partitioning(init, ("data", "model")),
                            rngs=rngs)
        self.b = nnx.Linear(64, 32, kernel_init=nnx.with_partitioning(init, ("model", "data")),
                            rngs=rngs)

    def __call__(self, x):
        return self.b(jax.nn.gelu(self.a(x)))


def mse(m, x, y):
    return jnp.mean((m(x) - y) ** 2)


def close(a, b):
    scale = max(float(jnp.linalg.norm(w)) for w in jax.tree.leaves(b)) or 1.0
    for g, w in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert float(jnp.linalg.norm(g - w)) <= 1e-5 * scale


with jax.set_mesh(mesh):
    model = MLP(nnx.Rngs(0))
    assert len(model.a.kernel[...].sharding.device_set) == 8
    x = jax.device_put(jnp.linspace(-1, 1, 512).reshape(16, 32), NamedSharding(mesh, P("data")))
    y = jnp.zeros((16, 32))
    loss, grads = nnx.jit(nnx.value_and_grad(mse))(model, x, y)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        p = jax_exec.plan(mse, model, x, y, budget="60%")
    assert any("sharded over 8 devices" in str(w.message) for w in seen)
    assert p.sharded_devices == 8 and p.replan("80%").sharded_devices == 8
    assert "sharded over 8 devices" in p.summary()
    vg = jax_exec.value_and_grad(mse, budget="60%")
    for got_loss, got in (nnx.jit(vg)(model, x, y), vg(model, x, y)):
        assert abs(float(got_loss) - float(loss)) <= 1e-6 * abs(float(loss))
        close(got, grads)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(grads), strict=True):
            assert g.sharding.is_equivalent_to(w.sharding, g.ndim), (g.sharding, w.sharding)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = vg.plan.run(model, x, y)
    assert any("sharded over several devices" in str(w.message) for w in seen)
    assert result.peak_bytes == vg.plan.schedule.meta["peak_memory"]
    close(result.grads, grads)
    # the device planner plans it and runs its ZeRO step through GSPMD on the model's
    # mesh (tests/jax_exec/test_gspmd_zero.py: every stage, placements, bytes)
    import optax
    dp = jax_exec.plan_device(mse, model, x, y, budget="80%", optimizer=optax.sgd(0.1),
                              data_parallel=4)
    assert dp.traced_mesh == {"data": 4, "model": 2} and dp.spmd == "gspmd"
    run = dp.run(model, x, y, mesh=mesh)
    assert abs(float(run.loss) - float(loss)) <= 1e-6 * abs(float(loss))
    close(run.grads, grads)
    assert run.state_bytes == dp.step.state.resident
print("ok")
"""


def test_fsdp_sharded_model_through_the_drop_in():
    env = dict(os.environ, XLA_FLAGS=device_flags(8))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
