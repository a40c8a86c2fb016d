"""Pipelines of traced Flax models, cut automatically (jax_exec.parallel.plan_pipeline).

On 4 host CPU devices (a subprocess: XLA_FLAGS must be set before jax is imported), a
decoder LM (tests/zoo/decoder_lm.py: RoPE tables, a KV-cache argument, tied embeddings)
and a CNN (tests/zoo/convnext.py with its stochastic depth rate at 0: Dropout of rate 0
draws nothing) are cut into 4 stages and run under 1F1B and ZB-H1: loss and gradients
equal plain ``nnx.value_and_grad`` (tolerance relative to the largest leaf), and the
bytes measured after every op equal the model's; the decoder LM again with device
memories below its store-all peaks, where the chunks' plans rematerialize, under
1F1B, ZB-H1 and the joint planner's schedule. In this process (one device): the
refusals (dropout drawing, arguments without the batch axis, a loss mixing the batch),
a summed loss, a joint list schedule run as modelled, and the automatic plan never
slower than storing every activation on the even cut at that baseline's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from figure_checks import check_figure
from flax import nnx

from jax_exec.parallel import plan_pipeline

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def assert_close(got, want, what: str) -> None:
    """Every leaf within 1e-5 of the largest leaf's magnitude (a None leaf: another
    process's)."""
    import numpy as np

    got = jax.tree_util.tree_leaves(got, is_leaf=lambda v: v is None)
    want = jax.tree_util.tree_leaves(want)
    assert len(got) == len(want), what
    scale = max(float(np.abs(np.asarray(w)).max()) for w in want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is not None:
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0,
                                       atol=1e-5 * scale, err_msg=f"{what}: leaf {k}")  # fmt: skip


def decoder_lm_case(batch: int = 8, n_layers: int = 3):
    """The zoo's decoder LM on a batch of ``batch`` sequences."""
    from zoo import decoder_lm

    cfg = decoder_lm.LlamaConfig(n_layers=n_layers)
    case = decoder_lm.make(cfg=cfg)
    t = 12
    seq = jax.random.randint(jax.random.key(3), (batch, t + 1), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(4 + jnp.arange(t, dtype=jnp.int32)[None], (batch, t))
    args = (seq[:, :-1], seq[:, 1:], decoder_lm.init_cache(cfg, batch), positions)
    return case, args


def convnext_case(batch: int = 8, drop_path_rate: float = 0.0):
    """The zoo's ConvNeXt without stochastic depth (rate 0) on ``batch`` images."""
    from zoo import convnext

    cfg = convnext.ConvNeXtConfig(drop_path_rate=drop_path_rate, depths=[2, 2])
    case = convnext.make(cfg=cfg)
    key = jax.random.key(5)
    images = jax.random.normal(key, (batch, 16, 16, 3))
    labels = jax.random.randint(jax.random.fold_in(key, 1), (batch,), 0, cfg.num_classes)
    return case, (images, labels)


def test_four_devices_1f1b_and_zb_h1_match_plain_value_and_grad():
    from xla_env import device_flags

    env = dict(os.environ, XLA_FLAGS=device_flags(4), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))  # fmt: skip
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    checked = [name.rsplit(" ", 1)[0] if "joint" in name else name for name in report["checked"]]
    assert checked == ["decoder_lm 1f1b", "decoder_lm zb_h1", "decoder_lm planned",
                       "decoder_lm planned zb_h1", "decoder_lm joint", "convnext 1f1b",
                       "convnext zb_h1"], report  # fmt: skip
    for name, stages in report["stages"].items():
        assert stages == 4, (name, report)


def check_plan(case, args, report: dict):
    """1F1B then ZB-H1 on the same automatic cut of 4 stages; returns the 1F1B plan."""
    model = case.factory()
    ref_loss, ref_grads = nnx.value_and_grad(case.loss_fn)(model, *args)
    plan = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4)
    report["stages"][case.name] = len(plan.cuts) - 1
    assert plan.loss_scale == 1.0 and plan.predicted.makespan > 0
    for p in (plan, plan.with_schedule("zb_h1")):
        step = p.run(model, *args, block=True)
        what = f"{case.name} {p.schedule_name}"
        assert_close(step.loss, ref_loss, f"{what}: loss")
        assert_close(step.grads, ref_grads, f"{what}: gradients")
        r = step.result
        assert len(r.op_device_bytes) == len(r.op_log) > 0
        assert r.op_device_bytes == r.op_model_bytes, (what, [
            (op, got, want) for (_, op, *_), got, want in
            zip(r.op_log, r.op_device_bytes, r.op_model_bytes, strict=True) if got != want
        ][:5])  # fmt: skip
        used = {d for leaf in jax.tree_util.tree_leaves(r.grads) for d in leaf.devices()}
        assert len(used) == 4, what  # every stage ran on its own device
        report["checked"].append(what)
    return plan


def memories(memory: int):
    """4 identical devices of ``memory`` bytes each, named d0..d3."""
    import schedir

    devices = [schedir.Device(f"d{u}", 1.0, memory) for u in range(4)]
    return schedir.Platform.fully_connected(devices, 100e9)


def check_step(plan, model, args, reference, what: str) -> None:
    """One step of ``plan``: loss and gradients equal ``reference`` (plain
    ``nnx.value_and_grad``), measured bytes equal the model's after every op."""
    step = plan.run(model, *args, block=True)
    assert_close(step.loss, reference[0], f"{what}: loss")
    assert_close(step.grads, reference[1], f"{what}: gradients")
    r = step.result
    assert r.op_device_bytes == r.op_model_bytes, (what, [
        (op, got, want) for (_, op, *_), got, want in
        zip(r.op_log, r.op_device_bytes, r.op_model_bytes, strict=True) if got != want
    ][:5])  # fmt: skip


def check_planned(case, args, free, report: dict) -> None:
    """Device memories at 0.8 of the store-all plan's largest predicted peak (1F1B), then
    of ZB-H1's: the cut and the chunks' plans rematerialize (rotor) where
    storing every activation does not fit; loss and gradients equal plain, measured
    bytes equal the model's after every op, predicted peaks within the memories."""
    import schedir
    from schedir.pipeline.baselines import BASELINES

    model = case.factory()
    reference = nnx.value_and_grad(case.loss_fn)(model, *args)
    memory = int(0.8 * max(free.predicted.device_peak.values()))
    plan = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4,
                         platform=memories(memory))  # fmt: skip
    assert any(p.kind == "rotor" and p.ops for p in plan.schedule.plans), plan.schedule.plans
    assert max(plan.predicted.device_peak.values()) <= memory, plan.predicted
    names = [f"d{u}" for u in range(4)]
    stored = BASELINES["1f1b"](plan.problem, names, cuts=list(plan.cuts))
    assert max(schedir.simulate_pipeline(plan.problem, stored).device_peak.values()) > memory
    check_step(plan, model, args, reference, "planned")
    report["checked"].append(f"{case.name} planned")
    # a zero-bubble schedule with per-stage plans: ZB-H1 at 0.8 of its store-all peak
    free_zb = free.with_schedule("zb_h1")
    memory = int(0.8 * max(free_zb.predicted.device_peak.values()))
    plan = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4,
                         platform=memories(memory), schedule="zb_h1")  # fmt: skip
    assert any(p.kind == "rotor" and p.ops for p in plan.schedule.plans), plan.schedule.plans
    assert max(plan.predicted.device_peak.values()) <= memory, plan.predicted
    check_step(plan, model, args, reference, "planned zb_h1")
    report["checked"].append(f"{case.name} planned zb_h1")


def check_joint(case, args, free, report: dict) -> None:
    """The joint planner's schedule (its cut, pattern and per-stage plans) at 0.8 of the
    store-all 1F1B plan's largest peak: loss and gradients equal plain, measured bytes
    equal the model's after every op, predicted peaks within the memories, every
    device used."""
    model = case.factory()
    reference = nnx.value_and_grad(case.loss_fn)(model, *args)
    memory = int(0.8 * max(free.predicted.device_peak.values()))
    plan = plan_pipeline(case.loss_fn, model, *args, devices=4, microbatches=4,
                         platform=memories(memory), schedule="joint")  # fmt: skip
    assert plan.schedule_name == "joint" and plan.schedule.meta["method"] == "pipeline_joint"
    assert max(plan.predicted.device_peak.values()) <= memory, plan.predicted
    assert len(set(plan.devices)) == 4
    check_step(plan, model, args, reference, "joint")
    report["checked"].append(f"{case.name} joint {plan.schedule.meta['pattern']}")


def _child() -> None:  # pragma: no cover - runs in the subprocess
    assert len(jax.devices()) == 4
    report: dict = {"checked": [], "stages": {}}
    case, args = decoder_lm_case()
    free = check_plan(case, args, report)
    check_planned(case, args, free, report)
    check_joint(case, args, free, report)
    check_plan(*convnext_case(), report)
    print(json.dumps(report), flush=True)


class MLP(nnx.Module):
    def __init__(self, width: int = 8, depth: int = 3, *, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return x


def test_a_summed_loss_is_summed_over_micro_batches():
    model = MLP(rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))

    def loss_fn(model, x):
        return jnp.sum(model(x) ** 2)

    plan = plan_pipeline(loss_fn, model, x, devices=1, microbatches=4)
    assert plan.loss_scale == 4.0
    step = plan.run(model, x)
    assert_close(step.loss, loss_fn(model, x), "loss")
    assert_close(step.grads, nnx.grad(loss_fn)(model, x), "gradients")


class Warmed(nnx.Module):
    """Every layer scaled by a factor the call computes from Python numbers."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(4)])

    def __call__(self, x, warm):
        for layer in self.layers:
            x = x + warm * jnp.tanh(layer(x))
        return x


def test_a_weakly_typed_value_carried_between_stages():
    """A warm-up factor made from a Python number (``functools.partial(loss_fn,
    step=3)``, as the refusal of a scalar argument says) is a weakly typed scalar that
    stage 0 computes and the later stages read: it was carried weakly typed, while the
    stages had been traced with their inputs strongly typed, so a stage's vjp closure was
    rebuilt from other pieces (ValueError: "Expected cotangent type float32[16,16] but
    got float32[16,4]" on the 16-wide model of the probe). Stages now pass such values
    strongly typed (``program_stages.encode``), and a closure made of other pieces than
    its recipe's raises instead of being rebuilt (``jax_exec.kernels``)."""
    import functools

    def loss_fn(model, x, step):
        return jnp.mean(model(x, jnp.minimum(1.0, (step + 1) / 10)) ** 2)

    model, x = Warmed(nnx.Rngs(0)), jax.random.normal(jax.random.key(0), (8, 8))
    warm = functools.partial(loss_fn, step=3)
    plan = plan_pipeline(warm, model, x, devices=[jax.devices()[0]] * 2, microbatches=2)
    assert len(plan.cuts) == 3
    step = plan.run(model, x)
    loss, grads = nnx.value_and_grad(warm)(model, x)
    assert_close(step.loss, loss, "loss")
    assert_close(step.grads, grads, "gradients")


def test_refusals_name_the_cause():
    model = MLP(rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))

    def mse(model, x, target):
        return jnp.mean((model(x) - target) ** 2)

    with pytest.raises(ValueError, match=r"args\[1\] has shape \[3, 8\]: .*batch size 8"):
        plan_pipeline(mse, model, x, jnp.zeros((3, 8)), devices=1)
    with pytest.raises(ValueError, match=r"args\[1\] is a int: .*functools.partial"):
        plan_pipeline(lambda m, x, step: mse(m, x, x) * step, model, x, 3, devices=1)
    with pytest.raises(ValueError, match="not divisible into 3 micro-batches"):
        plan_pipeline(mse, model, x, x, devices=1, microbatches=3)
    with pytest.raises(ValueError, match="schedule = 'zb'"):
        plan_pipeline(mse, model, x, x, devices=1, schedule="zb")

    def centered(model, x):  # batch statistics: micro-batching changes the loss
        out = model(x)
        return jnp.mean((out - out.mean(axis=0)) ** 2)

    with pytest.raises(ValueError, match="mixes the items of the batch"):
        plan_pipeline(centered, model, x, devices=1, microbatches=2)
    case, args = convnext_case(drop_path_rate=0.5)
    with pytest.raises(TypeError, match=r"changes its state .*dropout.*count"):
        plan_pipeline(case.loss_fn, case.factory(), *args, devices=1)
    normalized = nnx.Sequential(
        nnx.WeightNorm(nnx.Linear(8, 8, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(0))
    )
    with pytest.raises(TypeError, match=r"writes the model's parameter .*kernel.*WeightNorm"):
        plan_pipeline(mse, normalized, x, x, devices=1)
    with pytest.raises(ValueError, match="at most .* pipeline stages, asked for 4"):
        plan_pipeline(mse, model, x, x, devices=[jax.devices()[0]] * 4)


def test_the_cut_follows_device_speeds_and_memories():
    import schedir

    model = MLP(depth=6, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)

    two = jax.devices()[:1] * 2
    even = plan_pipeline(loss_fn, model, x, devices=two, microbatches=4)
    fast = schedir.Platform.fully_connected(
        [schedir.Device("fast", speed=4.0), schedir.Device("slow")], 1e9
    )
    plan = plan_pipeline(loss_fn, model, x, devices=two, microbatches=4, platform=fast)
    assert plan.cuts[1] > even.cuts[1], (plan.cuts, even.cuts)  # more blocks on "fast"
    assert [dev for dev, _ in plan.schedule.ops] == ["fast", "slow"]
    step = plan.run(model, x)
    assert_close(step.grads, nnx.grad(loss_fn)(model, x), "gradients")
    tiny = schedir.Platform.fully_connected(
        [schedir.Device("a", memory=1000), schedir.Device("b", memory=1000)], 1e9
    )
    with pytest.raises(schedir.InvalidSchedule, match="fits the devices' memory"):
        plan_pipeline(loss_fn, model, x, devices=two, microbatches=4, platform=tiny)
    with pytest.raises(ValueError, match="one chunk per device"):
        plan_pipeline(loss_fn, model, x, devices=two, platform=fast, schedule="v_shape")


def test_auto_schedule_and_cuts_by_hand():
    """``schedule="auto"`` keeps the shortest simulated step of every schedule tried
    (the two-chunk ones on a cut of their own), and draws it (``PipelinePlan.figure``);
    ``cuts=`` replaces the balanced cut and is checked."""
    model = MLP(depth=6, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 8))

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)

    two = jax.devices()[:1] * 2
    best = plan_pipeline(loss_fn, model, x, devices=two, microbatches=4, schedule="auto")
    names = [name for name, _ in best.alternatives]
    assert names == ["1f1b", "zb_h1", "zb_h2", "gpipe", "interleaved_1f1b", "v_shape", "joint"]
    assert best.predicted.makespan == min(t for _, t in best.alternatives)
    check_figure(best.figure(), "pipeline plan")  # every device's ops, the links, memory
    assert_close(best.run(model, x).grads, nnx.grad(loss_fn)(model, x), "gradients")
    L = best.model.length
    hand = plan_pipeline(loss_fn, model, x, devices=two, microbatches=4, cuts=(0, 1, L))
    assert hand.cuts == (0, 1, L)
    assert (
        hand.predicted.makespan
        >= plan_pipeline(loss_fn, model, x, devices=two, microbatches=4).predicted.makespan
    )  # the balanced cut is the DP's optimum of the slowest stage
    assert_close(hand.run(model, x).grads, nnx.grad(loss_fn)(model, x), "gradients")
    with pytest.raises(ValueError, match=r"cuts = \(0, 3\): expected 3 increasing"):
        plan_pipeline(loss_fn, model, x, devices=two, cuts=(0, 3))
    with pytest.raises(ValueError, match="the joint planner chooses the cut"):
        plan_pipeline(loss_fn, model, x, devices=two, cuts=(0, 1, L), schedule="joint")
    with pytest.raises(ValueError, match="the joint planner chooses its own cut"):
        hand.with_schedule("joint")


def test_a_joint_list_schedule_runs_as_modelled():
    """The joint planner's list schedule (F, Bi, W ordered under 7 kB per device, two
    chunks on rotor): loss and gradients equal plain, measured bytes equal the model's
    after every op (one device named three times: bytes are counted per name)."""
    import schedir

    model = MLP(width=16, depth=8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (8, 16))

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)

    devices = [schedir.Device(f"d{u}", 1.0, 7000) for u in range(3)]
    platform = schedir.Platform.fully_connected(devices, 1e9)
    plan = plan_pipeline(loss_fn, model, x, devices=jax.devices()[:1] * 3, microbatches=4,
                         platform=platform, schedule="joint")  # fmt: skip
    assert plan.schedule.meta["pattern"] == "list", plan.schedule.meta
    assert any(c.kind == "rotor" for c in plan.schedule.plans), plan.schedule.plans
    assert max(plan.predicted.device_peak.values()) <= 7000
    check_step(plan, model, (x,), nnx.value_and_grad(loss_fn)(model, x), "joint list")


def test_auto_is_never_slower_than_storing_all_on_the_even_cut():
    """At the largest peak of the best hand baseline (the blocks split evenly, every
    activation stored, the fastest of four schedules) as every device's memory, the
    automatic plan's step is no longer (that baseline is one of its candidates)."""
    import schedir

    model = MLP(depth=6, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (12, 8))

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)

    three = jax.devices()[:1] * 3

    def platform(memory=None):
        devices = [schedir.Device(f"d{u}", 1.0, memory) for u in range(3)]
        return schedir.Platform.fully_connected(devices, 1e9)

    first = plan_pipeline(loss_fn, model, x, devices=three, microbatches=6, platform=platform())
    L = first.model.length
    even = tuple(round(k * L / 3) for k in range(4))
    hand = plan_pipeline(loss_fn, model, x, devices=three, microbatches=6, cuts=even,
                         platform=platform())  # fmt: skip
    best = min((hand.with_schedule(s) for s in ("1f1b", "zb_h1", "zb_h2", "gpipe")),
               key=lambda p: p.predicted.makespan)  # fmt: skip
    memory = max(best.predicted.device_peak.values())
    auto = plan_pipeline(loss_fn, model, x, devices=three, microbatches=6, schedule="auto",
                         platform=platform(memory))  # fmt: skip
    assert auto.predicted.makespan <= best.predicted.makespan * (1 + 1e-12)
    assert max(auto.predicted.device_peak.values()) <= memory


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    _child()
