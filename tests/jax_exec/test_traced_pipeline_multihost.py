"""Traced pipelines on two processes of four CPU devices (``schedir launch``): the zoo's
decoder LM cut into 8 stages over the 8 devices of both processes, and the zoo's
ConvNeXt (stochastic depth rate 0) into 4 stages on two devices of each process, under
1F1B and ZB-H1 (the decoder LM also with per-stage plans within device memories):
measured bytes equal the model after every op on each process's devices, each
process's gradients (its stages', the tied embedding's summed
across processes on its first reader's device) and the loss (where the last stage
ran) equal plain ``nnx.value_and_grad``; between them the processes return every
gradient leaf once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # 36 s: -m slow
def test_two_processes_run_a_traced_plan_like_one_device():
    from launched import launch_reports

    reports = launch_reports(__file__, timeout=500, path=(ROOT / "tests", HERE))
    names = reports[0]["leaves"].keys()
    assert set(names) == {"decoder_lm 1f1b", "decoder_lm zb_h1", "decoder_lm zb_h1 planned",
                          "convnext 1f1b", "convnext zb_h1"}, reports  # fmt: skip
    for name in names:
        mine = [set(r["leaves"][name]) for r in reports.values()]
        assert not mine[0] & mine[1], (name, reports)  # every leaf from one process
        assert len(mine[0] | mine[1]) == reports[0]["total"][name], (name, reports)
        assert sum(r["loss"][name] for r in reports.values()) == 1, (name, reports)


def _child() -> None:  # pragma: no cover - runs in the launched processes
    from jax_exec.distributed import initialize_from_env

    group = initialize_from_env()
    import jax
    from flax import nnx
    from test_traced_pipeline import assert_close, convnext_case, decoder_lm_case

    import schedir
    from jax_exec.parallel import plan_pipeline

    assert group is not None and group.num_processes == 2 and len(jax.devices()) == 8
    report: dict = {"leaves": {}, "total": {}, "loss": {}}
    by_host = [[d for d in jax.devices() if d.process_index == p] for p in range(2)]
    for (case, args), devices in (
        (decoder_lm_case(n_layers=4), jax.devices()),
        (convnext_case(), [*by_host[0][:2], *by_host[1][:2]]),
    ):
        model = case.factory()
        ref_loss, ref_grads = nnx.value_and_grad(case.loss_fn)(model, *args)
        plan = plan_pipeline(case.loss_fn, model, *args, devices=devices, microbatches=4)
        assert len(plan.cuts) - 1 == len(devices)
        plans = [plan, plan.with_schedule("zb_h1")]
        if case.name == "decoder_lm":  # ZB-H1 with per-stage plans within device memories
            free = plans[1]
            memory = int(0.9 * max(free.predicted.device_peak.values()))
            platform = schedir.Platform.fully_connected(
                [schedir.Device(f"d{u}", 1.0, memory) for u in range(len(devices))], 100e9
            )
            planned = plan_pipeline(case.loss_fn, model, *args, devices=devices,
                                    microbatches=4, platform=platform,
                                    schedule="zb_h1")  # fmt: skip
            assert any(c.kind == "rotor" and c.ops for c in planned.schedule.plans)
            plans.append(replace(planned, schedule_name="zb_h1 planned"))
        for p in plans:
            step = p.run(model, *args)
            what = f"{case.name} {p.schedule_name}"
            r = step.result  # this process's devices, after every op it ran
            assert r.op_device_bytes == r.op_model_bytes and r.op_log, what
            assert_close(step.grads, ref_grads, what)
            leaves = jax.tree_util.tree_leaves(step.grads, is_leaf=lambda v: v is None)
            report["leaves"][what] = [k for k, v in enumerate(leaves) if v is not None]
            report["total"][what] = len(leaves)
            report["loss"][what] = int(step.loss is not None)
            if step.loss is not None:
                assert_close(step.loss, ref_loss, f"{what}: loss")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    _child()
