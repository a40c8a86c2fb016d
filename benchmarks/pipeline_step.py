"""Step time of the multi-device executors on 4 CPU devices: first call and later calls.

- ``run_pipeline``: a 1F1B and a ZB-H1 (split backwards) training step of a 6-layer
  residual MLP (4 micro-batches, 4 stages on 4 devices), the whole call (dispatch
  included, results ready);
- ``spmd_pipeline``: the SPMD GPipe forward of 8 stacked blocks on 4 stages, called
  eagerly (outside ``jax.jit``), and ``jax.grad`` of it;
- ``spmd_value_and_grad``: the same blocks in ZB-H1 order (B and W apart), eagerly.

The first call compiles; later calls should reuse the cached kernels (a few ms to a few
hundred ms on a loaded machine). Prints each call's seconds, their median after the
first, and the number of XLA compilations of every call (``jax.monitoring`` events), and
writes ``pipeline_step.json`` under ``--out``. It re-runs itself in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (set before jax is imported).

    python benchmarks/pipeline_step.py [--quick] [--steps N] [--out results/pipeline_step]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = "PIPELINE_STEP_CHILD"


def _measure(steps: int) -> dict:  # runs in the child process
    import jax
    import jax.numpy as jnp

    import schedir
    from jax_exec.pipeline.mpmd import run_pipeline
    from jax_exec.pipeline.spmd import (
        shard_stacked,
        spmd_pipeline,
        spmd_value_and_grad,
        stack_blocks,
        stage_mesh,
        stage_orders,
    )
    from schedir.pipeline.baselines import one_f_one_b_ops, zb_h1
    from schedir.pipeline.problem import Interval, Mapping, PipelineProblem
    from schedir_cli.models import mlp_stack, mse_loss

    compiles: list = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: (
            compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None
        )
    )

    def timed(call) -> tuple[float, int]:
        before, start = len(compiles), time.perf_counter()
        jax.block_until_ready(call())
        return time.perf_counter() - start, len(compiles) - before

    layers = mlp_stack(4, 16, 32, 8, 4)
    L = len(layers)
    x = jax.random.normal(jax.random.key(0), (16, 8))
    y = jax.random.normal(jax.random.key(1), (16, 4))
    chain = schedir.Chain.from_rotor([1.0] * L, [1.0] * (L + 1), [1] * (L + 1),
                                     [0] + [1] * L, [0] * L, [0] * (L + 1))  # fmt: skip
    devs = [schedir.Device(f"d{u}") for u in range(4)]
    pb = PipelineProblem(chain, [0] * L, schedir.Platform.fully_connected(devs, 1e9), 4, True)
    mapping = Mapping((Interval(0, 2, ("d0",)), Interval(2, 3, ("d1",)),
                       Interval(3, 5, ("d2",)), Interval(5, L, ("d3",))))  # fmt: skip
    schedule = one_f_one_b_ops(pb, mapping)

    zero_bubble = zb_h1(pb, cuts=[0, 2, 3, 5, L])

    def step(sched=schedule):
        r = run_pipeline(layers, sched, x, y, mse_loss)
        return r.loss, r.grads

    def block(p, a):
        return a + jnp.tanh(a @ p["w"] + p["b"])

    keys = jax.random.split(jax.random.key(2), 8)
    stacked = stack_blocks([{"w": 0.3 * jax.random.normal(k, (16, 16)), "b": jnp.full((16,), 0.1)}
                            for k in keys])  # fmt: skip
    mesh = stage_mesh(4)
    sharded = shard_stacked(stacked, mesh)
    xb = jax.random.normal(jax.random.key(3), (24, 16))
    grad = jax.grad(lambda p: jnp.sum(spmd_pipeline(block, p, xb, mesh, 6)))
    blocks_pb = PipelineProblem(schedir.Chain.from_rotor([1.0] * 8, [1.0] * 9, [1] * 9, [1] * 9,
                                                         [0] * 8, [0] * 9),
                                [0] * 8, pb.platform, 6, True)  # fmt: skip
    orders = stage_orders(zb_h1(blocks_pb))
    yb = jnp.zeros_like(xb)
    calls = {
        "run_pipeline_1f1b": step,
        "run_pipeline_zb_h1": lambda: step(zero_bubble),
        "spmd_forward_eager": lambda: spmd_pipeline(block, sharded, xb, mesh, 6),
        "spmd_grad_eager": lambda: grad(sharded),
        "spmd_zb_h1_eager": lambda: spmd_value_and_grad(
            block, mse_loss, sharded, xb, yb, mesh, orders
        ),  # fmt: skip
    }
    out = {"devices": len(jax.devices())}
    for name, call in calls.items():
        runs = [timed(call) for _ in range(steps)]
        out[name] = {
            "seconds": [round(t, 4) for t, _ in runs],
            "compilations": [n for _, n in runs],
            "median_after_first": statistics.median(t for t, _ in runs[1:]),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="3 calls of each")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "pipeline_step")
    args = parser.parse_args(argv)
    steps = 3 if args.quick else max(2, args.steps)
    if os.environ.get(CHILD):
        print(json.dumps(_measure(steps)))
        return {}
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **{CHILD: "1"})  # fmt: skip
    proc = subprocess.run([sys.executable, __file__, "--steps", str(steps)], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"pipeline_step: the measuring process failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipeline_step.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, r in result.items():
        if isinstance(r, dict):
            print(f"{name:20s} first {r['seconds'][0]:8.3f} s, then median "
                  f"{r['median_after_first']:.4f} s; compilations {r['compilations']}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
