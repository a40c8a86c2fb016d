"""Low-bit storage and offload in the per-stage plans of a traced pipeline
(``plan_pipeline(..., activation_tolerance=)``, jax_exec/pipeline/stage_storage.py;
a platform with a host link: offload plans run by the MPMD runtime).

On 4 host CPU devices (subprocesses, slow), the zoo's decoder LM with device memories
at 0.7 of its store-all 1F1B plan's largest peak:

- with a tolerance of 5%: chunks keep their residuals in bfloat16 or int8 (ZB-H1 fits
  there only so), loss and gradients equal plain ``nnx.value_and_grad`` within the
  tolerance (relative to the gradient's norm), the measured error the plan reports;
- with a host link: chunks offload activations to host memory (1F1B and the joint
  planner), loss and gradients equal plain within 1e-5 of the largest leaf;

measured device bytes (and host bytes) equal the model's after every op, predicted
peaks within the memories. In this process: without a tolerance and without a host
link the plans are today's; the refusals; the tolerance loop withdraws the least
precise storage; ChunkPlan's storage and host bytes round-trip through JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import schedir
from jax_exec.auto.lowbit import tolerated
from jax_exec.parallel import plan_pipeline
from schedir import InvalidSchedule
from schedir.pipeline.schedule import ChunkPlan, PipelineSchedule

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 0.05


def relative_error(got, want) -> float:
    got = [np.asarray(g, np.float64) for g in jax.tree_util.tree_leaves(got)]
    want = [np.asarray(w, np.float64) for w in jax.tree_util.tree_leaves(want)]
    diff = sum(float(np.sum((g - w) ** 2)) for g, w in zip(got, want, strict=True))
    return (diff / sum(float(np.sum(w**2)) for w in want)) ** 0.5


def four_devices(part: str) -> dict:
    """The subprocess's report of ``part`` ("lowbit" or "offload")."""
    from xla_env import device_flags

    env = dict(os.environ, XLA_FLAGS=device_flags(4), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))  # fmt: skip
    proc = subprocess.run([sys.executable, __file__, part], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_four_devices_low_bit_chunks_match_plain_within_the_tolerance():
    report = four_devices("lowbit")
    assert report["checked"] == ["1f1b", "zb_h1"], report
    for name in report["checked"]:
        assert report["storages"][name], report  # some chunk stores low-bit


@pytest.mark.slow
def test_four_devices_offload_chunks_match_plain():
    report = four_devices("offload")
    assert report["checked"] == ["1f1b", "joint"], report
    assert report["offloaded"]["1f1b"], report  # some chunk offloads under 1F1B


def decoder_lm_at(fraction: float):
    """The decoder LM, its plain loss and gradients, and the memory at ``fraction`` of
    its store-all 1F1B plan's largest predicted peak."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_traced_pipeline import decoder_lm_case

    case, args = decoder_lm_case()
    model = case.factory()
    reference = nnx.value_and_grad(case.loss_fn)(model, *args)
    free = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4)
    return case, args, model, reference, int(fraction * max(free.predicted.device_peak.values()))


def _offload_child() -> None:  # pragma: no cover - runs in the subprocess
    import dataclasses

    from test_traced_pipeline import check_step, memories

    case, args, model, reference, memory = decoder_lm_at(0.7)
    # a host link fast enough for this small model's copies to beat recomputation
    link = schedir.CopyEngine(1e14)
    platform = dataclasses.replace(memories(memory), offload=link, prefetch=link)
    report: dict = {"checked": [], "offloaded": {}}
    for name in ("1f1b", "joint"):
        plan = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4,
                             platform=platform, schedule=name)  # fmt: skip
        assert max(plan.predicted.device_peak.values()) <= memory, plan.predicted
        offloaded = [(p.first, p.last) for p in plan.schedule.plans if p.kind == "offload"]
        for p in plan.schedule.plans:
            assert (p.kind == "offload") == bool(p.host), p
        check_step(plan, model, args, reference, name)
        r = plan.run(model, *args, block=True).result
        assert r.op_host_bytes == r.op_model_host_bytes, name  # host memory, every op
        assert (max(r.op_host_bytes) > 0) == bool(offloaded), name
        report["checked"].append(name)
        report["offloaded"][name] = offloaded
    print(json.dumps(report), flush=True)


def _child() -> None:  # pragma: no cover - runs in the subprocess
    from test_traced_pipeline import check_step, memories

    assert len(jax.devices()) == 4
    case, args, model, (loss, grads), memory = decoder_lm_at(0.7)
    report: dict = {"checked": [], "storages": {}}
    for name in ("1f1b", "zb_h1"):
        plan = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4,
                             platform=memories(memory), schedule=name,
                             activation_tolerance=TOLERANCE)  # fmt: skip
        used = [p.storage for p in plan.schedule.plans if p.storage]
        assert max(plan.predicted.device_peak.values()) <= memory, plan.predicted
        assert plan.lowbit.gradient_error <= TOLERANCE, plan.lowbit
        assert [c[2] for c in plan.lowbit.storage] == [
            p.storage for p in sorted(plan.schedule.plans, key=lambda p: p.first)
        ]
        step = plan.run(model, *args, block=True)
        r = step.result
        assert r.op_device_bytes == r.op_model_bytes, name
        err = relative_error(step.grads, grads)
        # the runtime's error is the one measured while planning (another summation)
        assert err <= TOLERANCE, (err, plan.lowbit)
        assert abs(err - plan.lowbit.gradient_error) <= 1e-3, (err, plan.lowbit)
        assert abs(float(step.loss) - float(loss)) <= 1e-5 * max(1.0, abs(float(loss)))
        if not used:  # full precision: the plain equality of test_traced_pipeline
            check_step(plan, model, args, (loss, grads), name)
        report["checked"].append(name)
        report["storages"][name] = used
    print(json.dumps(report), flush=True)


class MLP(nnx.Module):
    """Residual tanh blocks (test_traced_pipeline's MLP has none): rotor's recomputation
    saves memory on them."""

    def __init__(self, width: int = 8, depth: int = 4, *, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

    def __call__(self, x):
        for layer in self.layers:
            x = x + jnp.tanh(layer(x))
        return x


def mlp_loss(model, x):
    return jnp.mean(model(x) ** 2)


def small_case():
    model = MLP(rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))
    two = jax.devices()[:2] if len(jax.devices()) >= 2 else jax.devices() * 2
    free = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4)
    top = max(free.predicted.device_peak.values())
    devices = [schedir.Device("a", memory=int(0.8 * top)), schedir.Device("b", memory=top)]
    return model, x, two, schedir.Platform.fully_connected(devices, 100e9)


def test_without_a_tolerance_and_a_host_link_the_plans_are_todays():
    from solvers.pipeline.joint import plan_pattern

    model, x, two, tight = small_case()
    plan = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4, platform=tight)
    # the per-stage planner's call before low-bit storage and offload were offered
    today = plan_pattern(plan.problem, "1f1b", ["a", "b"], None, steps=1)
    assert plan.schedule == today and plan.lowbit is None
    assert any(p.kind == "rotor" for p in today.plans)  # the memory binds
    assert all(p.storage is None and p.host is None for p in today.plans)
    zero = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4, platform=tight,
                         activation_tolerance=0.0)  # fmt: skip
    assert zero.schedule == today and zero.lowbit is None
    # a tolerance without device memories: store-all fits, nothing is measured
    free = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4,
                         activation_tolerance=0.1)  # fmt: skip
    assert free.lowbit is None and free.storage_check is None


def test_the_v_shape_turn_counts_its_activation_once():
    """The V-shape with per-chunk plans (footprints and held bytes): the chunk after
    the turn reads the activation the chunk before it holds on the same device, counted
    once, so the runtime's measured bytes equal the plans' after every op; the joint
    planner takes the V-shape among its patterns."""
    import dataclasses

    from jax_exec.pipeline.schedules import JOINT_PATTERNS, chunk_cuts, predicted_figures
    from solvers.pipeline.joint import plan_pattern

    model = MLP(depth=8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))
    two = jax.devices()[:2] if len(jax.devices()) >= 2 else jax.devices() * 2
    free = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4, schedule="v_shape")
    memory = int(1.5 * max(free.predicted.device_peak.values()))  # store-all plans
    devices = [schedir.Device(f"d{u}", memory=memory) for u in range(2)]
    problem = dataclasses.replace(
        free.problem, platform=schedir.Platform.fully_connected(devices, 100e9)
    )
    v = plan_pattern(problem, "v_shape", ["d0", "d1"], steps=1)
    turn = [p for p in v.plans if p.device == "d1"]
    assert len(turn) == 2 and all(p.held is not None for p in turn), v.plans
    plan = dataclasses.replace(free, schedule=v, cuts=chunk_cuts(v), problem=problem,
                               predicted=predicted_figures(problem, v))  # fmt: skip
    step = plan.run(model, x, block=True)
    r = step.result
    assert r.op_device_bytes == r.op_model_bytes
    loss, grads = nnx.value_and_grad(mlp_loss)(model, x)
    assert abs(float(step.loss) - float(loss)) < 1e-5
    assert relative_error(step.grads, grads) < 1e-5
    assert "v_shape" in JOINT_PATTERNS


def test_refusals_name_the_field():
    model, x, two, tight = small_case()
    kw = dict(devices=two, microbatches=4, platform=tight)
    with pytest.raises(ValueError, match="activation_storages: low-bit storage needs"):
        plan_pipeline(mlp_loss, model, x, activation_storages=("int8",), **kw)
    with pytest.raises(ValueError, match="'fp4' unknown"):
        plan_pipeline(mlp_loss, model, x, activation_tolerance=0.1,
                      activation_storages=("fp4",), **kw)  # fmt: skip
    with pytest.raises(ValueError, match="activation_tolerance = -1"):
        plan_pipeline(mlp_loss, model, x, activation_tolerance=-1, **kw)


def test_the_tolerance_loop_withdraws_the_least_precise_storage():
    offered = ["bfloat16", "float8_e4m3fn", "int8"]
    errors = {"float8_e4m3fn": 0.3, "int8": 0.2, "bfloat16": 0.01}
    got, err = tolerated(lambda: tuple(offered), set, lambda s: max(errors[k] for k in s),
                         0.05, offered.remove)  # fmt: skip
    assert got == ("bfloat16",) and err == 0.01 and offered == ["bfloat16"]


def test_chunk_plan_storage_and_host_round_trip_and_are_checked():
    low = ChunkPlan(0, 2, "d0", 96, "store_all", 0.5, (), 64, "int8")
    ops = ("Offload(a[0])", "F_all(0)", "Wait(a[0])", "F_all(1)", "Loss()", "B(1)",
           "Prefetch(a[0])", "Wait(a[0])", "B(0)")  # fmt: skip
    off = ChunkPlan(2, 4, "d0", 96, "offload", 0.0, ops, 40, None, 8)
    s = PipelineSchedule((("d0", ()),), plans=(low, off))
    assert PipelineSchedule.from_dict(json.loads(json.dumps(s.to_dict()))).plans == (low, off)
    with pytest.raises(InvalidSchedule, match="storage = 'fp4'"):
        ChunkPlan(0, 2, "d0", 96, "store_all", storage="fp4")
    with pytest.raises(InvalidSchedule, match="host = -1"):
        ChunkPlan(0, 2, "d0", 96, "offload", host=-1)


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).parent))
    _offload_child() if sys.argv[1:] == ["offload"] else _child()
