"""The suite compiles without LLVM's optimizations (tests/xla_env.py); users do not.
These tests plan and run models in a process at XLA's default level, where the op-by-op
runtime's kernels are optimized while the planner read their temporary bytes from
unoptimized compiles: ``BlockModel.kernel`` raises if the two differ, and the measured
peak must equal the prediction."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _child(names: list[str]) -> None:
    import auto_models
    import jax.numpy as jnp
    from flax import nnx

    from jax_exec import auto

    assert "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
    made = {
        "mlp": lambda: auto_models.make_mlp(depth=2),
        "gpt": lambda: auto_models.make_gpt(vocab=32, dim=16, heads=2, depth=1, length=8, batch=2),
        "resnet": lambda: auto_models.make_resnet(width=4, size=8),
        "unet": lambda: auto_models.make_unet(width=4, size=8),
    }
    for name in names:
        factory, loss_fn, args = made[name]()
        p = auto.plan(loss_fn, factory(), *args, budget="60%")
        result = p.run(factory(), *args)
        assert result.peak_bytes == p.schedule.meta["peak_memory"] <= p.budget
        loss, _ = nnx.value_and_grad(loss_fn)(factory(), *args)
        assert jnp.allclose(result.loss, loss, rtol=1e-5)
    print("ok")


def _run(*names: str) -> None:
    flags = " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if "optimization_level" not in f
    )
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))  # fmt: skip
    command = [sys.executable, __file__, *names]
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_planned_bytes_hold_at_the_default_optimization_level():
    _run("mlp")


@pytest.mark.slow
def test_planned_bytes_hold_at_the_default_level_on_every_test_model():
    _run("gpt", "resnet", "unet")


if __name__ == "__main__":
    _child(sys.argv[1:])
