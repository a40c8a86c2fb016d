"""Low-bit storage in the per-stage plans of a traced pipeline
(``plan_pipeline(..., activation_tolerance=)``, jax_exec/pipeline/stage_storage.py).

On 4 host CPU devices (a subprocess, slow): the zoo's decoder LM with device memories
at 0.7 of its store-all 1F1B plan's largest peak and a tolerance of 5%: chunks keep
their residuals in bfloat16 or int8 (ZB-H1 fits there only so), loss and gradients
equal plain ``nnx.value_and_grad`` within the tolerance (relative to the gradient's
norm), the measured error the plan reports, measured bytes equal the model's after
every op, predicted peaks within the memories. In this process: without a tolerance
(or without memories) the plans are today's; the refusals; the tolerance loop
withdraws the least precise storage; ChunkPlan's storage round-trips through JSON."""

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


@pytest.mark.slow
def test_four_devices_low_bit_chunks_match_plain_within_the_tolerance():
    from xla_env import device_flags

    env = dict(os.environ, XLA_FLAGS=device_flags(4), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))  # fmt: skip
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["checked"] == ["1f1b", "zb_h1"], report
    for name in report["checked"]:
        assert report["storages"][name], report  # some chunk stores low-bit


def _child() -> None:  # pragma: no cover - runs in the subprocess
    sys.path.insert(0, str(Path(__file__).parent))
    from test_traced_pipeline import check_step, decoder_lm_case, memories

    assert len(jax.devices()) == 4
    case, args = decoder_lm_case()
    model = case.factory()
    loss, grads = nnx.value_and_grad(case.loss_fn)(model, *args)
    free = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4)
    memory = int(0.7 * max(free.predicted.device_peak.values()))
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
    def __init__(self, width: int = 8, depth: int = 4, *, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

    def __call__(self, x):
        for layer in self.layers:
            x = x + jnp.tanh(layer(x))
        return x


def mlp_loss(model, x):
    return jnp.mean(model(x) ** 2)


def small_case():
    import schedir

    model = MLP(rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))
    two = jax.devices()[:2] if len(jax.devices()) >= 2 else jax.devices() * 2
    free = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4)
    top = max(free.predicted.device_peak.values())
    devices = [schedir.Device("a", memory=int(0.8 * top)), schedir.Device("b", memory=top)]
    return model, x, two, schedir.Platform.fully_connected(devices, 100e9)


def test_without_a_tolerance_the_plans_are_todays():
    model, x, two, tight = small_case()
    today = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4, platform=tight)
    zero = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4, platform=tight,
                         activation_tolerance=0.0)  # fmt: skip
    assert zero.schedule == today.schedule and zero.lowbit is None
    assert all(p.storage is None for p in today.schedule.plans)
    # a tolerance without device memories: store-all fits, nothing is measured
    free = plan_pipeline(mlp_loss, model, x, devices=two, microbatches=4,
                         activation_tolerance=0.1)  # fmt: skip
    assert free.lowbit is None and free.storage_check is None


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


def test_chunk_plan_storage_round_trips_and_is_checked():
    plan = ChunkPlan(0, 2, "d0", 96, "store_all", 0.5, (), 64, "int8")
    s = PipelineSchedule((("d0", ()),), plans=(plan,))
    assert PipelineSchedule.from_dict(json.loads(json.dumps(s.to_dict()))).plans == (plan,)
    with pytest.raises(InvalidSchedule, match="storage = 'fp4'"):
        ChunkPlan(0, 2, "d0", 96, "store_all", storage="fp4")


if __name__ == "__main__":  # pragma: no cover
    _child()
