"""Multi-device execution on 4 CPU devices (in a subprocess: XLA_FLAGS must be set
before jax is imported): MPMD 1F1B / GPipe / zero-bubble (split backwards) / V-shape
and interleaved (virtual stages) / recomputing training and replicated inference, the
measured bytes against the ops' model and the simulator, the SPMD shard_map pipeline
(GPipe by autodiff; 1F1B and ZB-H1 orders with B and W apart), and the dynamic mode,
all against the single-device model. Every generated schedule on 4 devices (and on 2
processes of 4) is in test_pipeline_multihost.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 12 s; traced pipelines cover multi-device MPMD in the default run
def test_multi_device_execution_matches_the_single_device_model():
    from xla_env import device_flags  # tests/ is not on the child's path

    env = dict(os.environ, XLA_FLAGS=device_flags(4),
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))  # fmt: skip
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 4
    assert set(report["checked"]) >= {"1f1b", "gpipe", "solver_1f1b", "inference", "spmd",
                                      "spmd_nnx", "dmda", "eager", "cached",
                                      "current_params", "spmd_cached", "executor", "zb_h1",
                                      "v_shape", "recompute", "memory", "zb_cached",
                                      "spmd_zb_h1", "joint", "tight_1f1b",
                                      "joint_rotor"}  # fmt: skip


def _close(a, b, what: str) -> None:
    import jax
    import numpy as np

    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb), what
    for u, v in zip(la, lb, strict=True):
        u, v = np.asarray(u), np.asarray(v)
        np.testing.assert_allclose(
            u, v, rtol=1e-5, atol=1e-5 * float(np.abs(v).max()), err_msg=what
        )


def _child() -> None:  # pragma: no cover - runs in the subprocess
    from collections import Counter

    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_exec
    import schedir
    import solvers
    from jax_exec.pipeline.chunks import (
        ChunkProgram,
        recompute_ops,
        weight_data_bytes,
    )
    from jax_exec.pipeline.dynamic import run_dynamic
    from jax_exec.pipeline.mpmd import _activation_avals, chunk_chain_ops, run_pipeline
    from jax_exec.pipeline.spmd import (
        nnx_blocks,
        sequential,
        shard_stacked,
        spmd_pipeline,
        spmd_value_and_grad,
        stack_blocks,
        stage_mesh,
        stage_orders,
    )
    from jax_exec.stages import as_stages
    from schedir.chain.ops import store_all_ops
    from schedir.pipeline.baselines import BASELINES, gpipe_ops, one_f_one_b_ops
    from schedir.pipeline.problem import Interval, Mapping, PipelineProblem
    from schedir.pipeline.schedule import PipelineSchedule, expand
    from schedir.steady import inference_pattern
    from schedir_cli.models import MLPBlock, mlp_stack, mse_loss
    from solvers.pipeline.stage_plans import sub_chain

    assert len(jax.devices()) == 4
    checked = []
    compiles = []  # one entry per XLA compilation (public jax.monitoring events)
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: (
            compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None
        )
    )
    layers = mlp_stack(4, 16, 32, 8, 4)
    L = len(layers)
    x = jax.random.normal(jax.random.key(0), (16, 8))
    y = jax.random.normal(jax.random.key(1), (16, 4))
    stages = as_stages(layers)

    def apply_all(params, a):
        for s, p in zip(stages, params, strict=True):
            a = s.apply(p, s.rest, a)
        return a

    # jitted: eager autodiff would compile a program per primitive
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(lambda p: mse_loss(apply_all(p, x), y)))(
        [s.params for s in stages])  # fmt: skip
    chain = schedir.Chain.from_rotor([1.0] * L, [1.0] * (L + 1), [1] * (L + 1),
                                     [0] + [1] * L, [0] * L, [0] * (L + 1))  # fmt: skip
    devs = [schedir.Device(f"d{u}", 2.0 if u == 0 else 1.0) for u in range(4)]
    plat = schedir.Platform.fully_connected(devs, 1e9)
    pb = PipelineProblem(chain, [0] * L, plat, 4, True)
    mapping = Mapping((Interval(0, 2, ("d0",)), Interval(2, 3, ("d1",)),
                       Interval(3, 5, ("d2",)), Interval(5, 6, ("d3",))))  # fmt: skip
    solved = solvers.get("pipeline_1f1b", pb).function(pb)
    peaks = {}
    for name, sched in (("1f1b", one_f_one_b_ops(pb, mapping)), ("gpipe", gpipe_ops(pb, mapping)),
                        ("solver_1f1b", solved)):  # fmt: skip
        r = run_pipeline(layers, sched, x, y, mse_loss)
        _close(r.loss, ref_loss, name)
        _close(r.grads, ref_grads, name)
        used = {d for leaf in jax.tree_util.tree_leaves(r.grads) for d in leaf.devices()}
        assert len(used) == len(sched.ops), name  # every stage ran on its own device
        assert set(r.device_peaks) == {dev for dev, _ in sched.ops}, name
        assert all(v > 0 for v in r.device_peaks.values()), (name, r.device_peaks)
        peaks[name] = r.device_peaks
        checked.append(name)
    # GPipe keeps every micro-batch's residuals until the backward: never less than 1F1B
    assert all(peaks["gpipe"][d] >= peaks["1f1b"][d] for d in peaks["1f1b"]), peaks
    # the one entry point dispatches a PipelineSchedule to run_pipeline
    r = jax_exec.run(layers, mse_loss, one_f_one_b_ops(pb, mapping), x, y)
    _close(r.grads, ref_grads, "executor")
    checked.append("executor")
    # a second step compiles nothing and reads the parameters as they are now
    sched = one_f_one_b_ops(pb, mapping)
    before = len(compiles)
    r = run_pipeline(layers, sched, x, y, mse_loss)
    assert len(compiles) == before, compiles[before:]
    _close(r.grads, ref_grads, "cached")
    checked.append("cached")
    layers[0].kernel.value = layers[0].kernel.value * 2.0
    new_loss, new_grads = jax.jit(jax.value_and_grad(lambda p: mse_loss(apply_all(p, x), y)))(
        [s.params for s in as_stages(layers)])  # fmt: skip
    before = len(compiles)
    r = run_pipeline(layers, sched, x, y, mse_loss)
    assert len(compiles) == before, compiles[before:]
    _close(r.loss, new_loss, "current_params")
    _close(r.grads, new_grads, "current_params")
    checked.append("current_params")
    layers[0].kernel.value = layers[0].kernel.value / 2.0
    # split backwards, virtual stages, recomputation (the generators of
    # schedir.pipeline.baselines on the cuts of the mapping above)
    cuts = [0, 2, 3, 5, 6]
    plain = {}
    for name, sched in (
        ("zb_h1", BASELINES["zb_h1"](pb, cuts=cuts)),
        ("v_shape", BASELINES["v_shape"](pb, ["d0", "d1"], cuts=cuts)),  # the V turns on d1
        ("recompute", BASELINES["1f1b"](pb, cuts=cuts, recompute=[0.0, 1.0, 1.0, 0.0])),
    ):
        r = run_pipeline(layers, sched, x, y, mse_loss)
        _close(r.loss, ref_loss, name)
        _close(r.grads, ref_grads, name)
        plain[name] = r.device_peaks
        checked.append(name)
    # a recomputing stage keeps its input only: less than 1F1B's residuals
    assert all(plain["recompute"][d] < peaks["1f1b"][d] / 4 for d in ("d1", "d2")), plain
    before = len(compiles)
    r = run_pipeline(layers, BASELINES["zb_h1"](pb, cuts=cuts), x, y, mse_loss)
    assert len(compiles) == before, compiles[before:]
    _close(r.grads, ref_grads, "zb_cached")
    checked.append("zb_cached")
    # measured bytes against the ops' model on the profiled sizes (the target counted):
    # equal after every op, for every baseline, split backwards freeing nothing early
    # (no wgrad_bytes) or per stage (the profiled wgrad_bytes); and the simulator
    prof = jax_exec.parallel.profile_stages(layers, mse_loss, x[:4], y[:4], timing="flops")
    target = int(y[:4].nbytes)
    pbp = PipelineProblem(prof, [0] * L, plat, 4, True, target_bytes=target)
    wgrad = weight_data_bytes(stages, _activation_avals(stages, x[:4]))
    pbw = PipelineProblem(prof, [0] * L, plat, 4, True, wgrad_bytes=wgrad, target_bytes=target)
    for problem, names in ((pbp, BASELINES), (pbw, ("zb_h1", "zb_h2", "v_shape"))):
        for name in names:
            two = ["d0", "d1"] if name in ("interleaved_1f1b", "v_shape") else None
            sched = BASELINES[name](problem, two, cuts=cuts)
            r = run_pipeline(layers, sched, x, y, mse_loss, problem=problem, block=True)
            _close(r.grads, ref_grads, f"memory {name}")
            assert len(r.op_device_bytes) == len(r.op_log)
            assert r.op_device_bytes == r.op_model_bytes, (name, [
                (op, got, want) for (_, op, *_), got, want in
                zip(r.op_log, r.op_device_bytes, r.op_model_bytes, strict=True) if got != want
            ][:5])  # fmt: skip
            sim = schedir.simulate_pipeline(problem, sched).device_peak
            model: dict = {}
            for (dev, *_), want in zip(r.op_log, r.op_model_bytes, strict=True):
                model[dev] = max(model.get(dev, 0), want)
            assert all(model[d] <= sim[d] for d in model), (name, model, sim)  # + working sets
    checked.append("memory")
    # 1F1B planned at tight memory (pipeline_1f1b: rotor on the chunks that need it, run
    # as planned): the measured bytes never exceed a device's memory
    for memory in (9_000, 12_000):
        tight = schedir.Platform.fully_connected([schedir.Device(f"d{u}", 1.0, memory)
                                                  for u in range(4)], 1e9)  # fmt: skip
        pbt = PipelineProblem(prof, [0] * L, tight, 4, True, target_bytes=target)
        sched = solvers.solve(pbt, None, "pipeline_1f1b")
        assert any(p.kind == "rotor" and p.ops for p in sched.plans)
        r = run_pipeline(layers, sched, x, y, mse_loss, problem=pbt, block=True)
        _close(r.grads, ref_grads, f"tight 1f1b {memory}")
        assert max(r.op_device_bytes) <= memory, (memory, r.device_peaks)
        assert all(got <= want for got, want in zip(r.op_device_bytes, r.op_model_bytes,
                                                     strict=True))  # fmt: skip
    checked.append("tight_1f1b")
    # the joint planner's schedule (list scheduling of F, Bi, W under 10 kB per device)
    tight = schedir.Platform.fully_connected([schedir.Device(f"d{u}", 1.0, 10_000)
                                              for u in range(4)], 1e9)  # fmt: skip
    joint = solvers.get("pipeline_joint", pbp).function(PipelineProblem(prof, [0] * L, tight, 4,
                                                                        True))  # fmt: skip
    r = run_pipeline(layers, joint, x, y, mse_loss)
    _close(r.loss, ref_loss, "joint")
    _close(r.grads, ref_grads, "joint")
    checked.append("joint")
    # a rotor plan of the joint planner (2 devices, 8 kB each), through JSON: the chunk
    # holds what rotor's schedule of its sub-chain holds before its Loss (less than
    # storing all, more than recomputing all), and the step gives the same gradients
    pair = schedir.Platform.fully_connected([schedir.Device(f"d{u}", 1.0, 8_000)
                                             for u in range(2)], 1e9)  # fmt: skip
    pb2 = PipelineProblem(prof, [0] * L, pair, 4, True, wgrad_fraction=(0.5,) * L,
                          target_bytes=target)  # fmt: skip
    joint = PipelineSchedule.from_dict(json.loads(json.dumps(
        solvers.solve(pb2, None, "pipeline_joint").to_dict())))  # fmt: skip
    rotor = [p for p in joint.plans if p.kind == "rotor"]
    assert rotor and all(p.ops for p in rotor), joint.plans
    specs = _activation_avals(stages, x[:4])
    for plan in rotor:
        i, j = plan.first, plan.last
        ops = chunk_chain_ops(joint, i, j)
        held = {}
        for kind, chain_ops in (("rotor", ops), ("store_all", store_all_ops(j - i)),
                                ("recompute", recompute_ops(j - i))):  # fmt: skip
            prog = ChunkProgram(stages, i, j, specs, mse_loss if j == L else None, chain_ops)
            table, _ = prog.forward([s.params for s in stages[i:j]], [s.rest for s in stages[i:j]],
                                    jnp.zeros(specs[i].shape, specs[i].dtype))  # fmt: skip
            trace = schedir.simulate(sub_chain(prof, i, j), chain_ops)
            at = next(k for k, op in enumerate(chain_ops) if isinstance(op, schedir.Loss))
            held[kind] = sum({id(a): int(a.nbytes) for a in jax.tree_util.tree_leaves(table)}
                             .values())  # fmt: skip
            assert held[kind] == trace.resident[at - 1], (kind, held, trace.resident)
            assert kind != "rotor" or trace.peak_memory <= plan.footprint
        assert held["recompute"] < held["rotor"] < held["store_all"], held
    r = run_pipeline(layers, joint, x, y, mse_loss, problem=pb2, block=True)
    _close(r.loss, ref_loss, "joint_rotor")
    _close(r.grads, ref_grads, "joint_rotor")
    # a plan's footprint reserves its peak (temporaries, the backward included)
    assert all(got <= want for got, want in zip(r.op_device_bytes, r.op_model_bytes,
                                                 strict=True))  # fmt: skip
    checked.append("joint_rotor")
    pbi = PipelineProblem(chain, [0] * L, plat, 4, False)
    mi = Mapping((Interval(0, 3, ("d0", "d1")), Interval(3, 6, ("d2", "d3"))))
    r = run_pipeline(layers, expand(inference_pattern(pbi, mi), 4), x)
    _close(r.outputs, apply_all([s.params for s in stages], x), "inference")
    checked.append("inference")

    def block(p, a):
        return a + jnp.tanh(a @ p["w"] + p["b"])

    keys = jax.random.split(jax.random.key(2), 8)
    stacked = stack_blocks([{"w": 0.3 * jax.random.normal(k, (16, 16)), "b": jnp.full((16,), 0.1)}
                            for k in keys])  # fmt: skip
    xb = jax.random.normal(jax.random.key(3), (24, 16))
    yb = jax.random.normal(jax.random.key(4), (24, 16))
    mesh = stage_mesh(4)
    for name, (fn, params) in (("spmd", (block, stacked)),
                               ("spmd_nnx", nnx_blocks([MLPBlock(16, 32, rngs=nnx.Rngs(i))
                                                        for i in range(4)]))):  # fmt: skip
        lp, gp = jax.jit(jax.value_and_grad(
            lambda p, fn=fn: jnp.mean((spmd_pipeline(fn, p, xb, mesh, 6) - yb) ** 2)))(
            shard_stacked(params, mesh))  # fmt: skip
        ls, gs = jax.value_and_grad(lambda p, fn=fn: jnp.mean((sequential(fn, p, xb) - yb) ** 2))(
            params)  # fmt: skip
        _close(lp, ls, name)
        _close(gp, gs, name)
        checked.append(name)
    # explicit orders, B and W as separate computations (1F1B: BW ops; ZB-H1: B, W)
    ls, gs = jax.value_and_grad(lambda p: mse_loss(sequential(block, p, xb), yb))(stacked)
    unit = schedir.Chain.from_rotor([1.0] * 8, [1.0] * 9, [1] * 9, [1] * 9, [0] * 8, [0] * 9)
    pbs = PipelineProblem(unit, [0] * 8, plat, 6, True)
    for name in ("zb_h1",):  # 1F1B too on 2 processes: test_pipeline_multihost.py
        orders = stage_orders(BASELINES[name](pbs))
        assert any(k == "W" for k, _ in orders[1])
        lp, gp = spmd_value_and_grad(block, mse_loss, shard_stacked(stacked, mesh), xb, yb,
                                     mesh, orders)  # fmt: skip
        _close(lp, ls, f"spmd_{name}")
        _close(gp, gs, f"spmd_{name}")
        checked.append(f"spmd_{name}")
    # called again outside jit (eagerly), the SPMD pipeline compiles nothing new
    sharded = shard_stacked(stacked, mesh)
    jax.block_until_ready(spmd_pipeline(block, sharded, xb, mesh, 6))
    before = len(compiles)
    out = spmd_pipeline(block, sharded, xb, mesh, 6)
    assert len(compiles) == before, compiles[before:]
    _close(out, sequential(block, stacked, xb), "spmd_cached")
    checked.append("spmd_cached")
    big = mlp_stack(4, 32, 64, 8, 4)
    xd = jax.random.normal(jax.random.key(5), (32, 8))
    ref = xd
    for s in as_stages(big):
        ref = s.apply(s.params, s.rest, ref)
    for policy in ("dmda", "eager"):
        r = run_dynamic(big, xd, policy=policy, microbatches=8, cuts=(0, 2, 4, 6))
        _close(r.outputs, ref, policy)
        assert sum(r.counts.values()) == 8 * 3 and r.predicted.makespan > 0
        assert 0 <= r.same_device <= 1
        # one op_log entry per task: (device, task, start, end), placed where counted
        assert len(r.op_log) == 8 * 3 and all(start <= end for _, _, start, end in r.op_log)
        assert Counter(dev for dev, *_ in r.op_log) == Counter(r.counts)
        checked.append(policy)
    print(json.dumps({"devices": len(jax.devices()), "checked": checked}))


if __name__ == "__main__":
    _child()
