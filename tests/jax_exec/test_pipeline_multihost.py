"""Two processes of four CPU devices each, one JAX job (``schedir launch``): every
generated training schedule (the six baselines and the joint planner's), executed by
the MPMD runtime on the 8 devices of both processes (sends between hosts through
jax.distributed) and on each process's own 4 devices, and the SPMD runner (1F1B and
ZB-H1 orders) on a mesh over both processes, give the single-device loss and
gradients (rtol 1e-5). One launch runs them all."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

WIDTH, MICROBATCHES, BATCH = 8, 8, 16


def test_two_processes_run_every_schedule_like_one_device():
    from launched import launch_reports

    start = time.perf_counter()
    reports = launch_reports(__file__, timeout=300)
    seconds = time.perf_counter() - start
    names = {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "v_shape", "joint"}
    for rep in reports.values():
        assert rep["processes"] == 2 and rep["devices"] == 8 and rep["local"] == 4
        assert set(rep["local_4"]) == names, rep  # each process alone on its 4 devices
        assert set(rep["spmd"]) == {"1f1b", "zb_h1"}, rep
    for name in names:
        # between them the two processes checked every stage's gradient and the loss
        stages = set(reports[0]["hosts_8"][name]) | set(reports[1]["hosts_8"][name])
        L = 16 if name in ("interleaved_1f1b", "v_shape") else 8
        assert stages == set(range(L)), (name, reports)
        assert sum(r["loss_8"][name] for r in reports.values()) == 1, (name, reports)
    print(f"two-process launch: {seconds:.1f} s")


def _close(a, b, what: str) -> None:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()), err_msg=what)


def _child() -> None:  # pragma: no cover - runs in the launched processes
    from jax_exec.distributed import initialize_from_env

    group = initialize_from_env()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import schedir
    import solvers
    from jax_exec.pipeline.mpmd import run_pipeline
    from jax_exec.pipeline.spmd import (
        nnx_blocks,
        sequential,
        shard_stacked,
        spmd_value_and_grad,
        stage_mesh,
        stage_orders,
    )
    from jax_exec.stages import as_stages
    from schedir.pipeline.baselines import BASELINES
    from schedir.pipeline.problem import PipelineProblem
    from schedir_cli.models import mse_loss

    assert group is not None and group.num_processes == 2

    class Block(nnx.Module):
        """``x + tanh(W x + b)``: small, so that the kernels compile fast."""

        def __init__(self, width: int, *, rngs: nnx.Rngs) -> None:
            self.linear = nnx.Linear(width, width, rngs=rngs)

        def __call__(self, x):
            return x + jnp.tanh(self.linear(x))

    blocks = [Block(WIDTH, rngs=nnx.Rngs(k)) for k in range(2 * 8)]
    x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH))
    y = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))

    def reference(L: int):
        stages = as_stages(blocks[:L])

        def loss(params):
            a = x
            for s, p in zip(stages, params, strict=True):
                a = s.apply(p, s.rest, a)
            return mse_loss(a, y)

        return jax.jit(jax.value_and_grad(loss))([s.params for s in stages])

    refs = {L: reference(L) for L in (4, 8, 16)}

    def problem(L: int, platform) -> PipelineProblem:
        chain = schedir.Chain.from_rotor([1.0] * L, [1.0] * (L + 1), [1] * (L + 1),
                                         [0] + [1] * L, [0] * L, [0] * (L + 1))  # fmt: skip
        return PipelineProblem(chain, [0] * L, platform, MICROBATCHES, True)

    def generate(name: str, L: int, platform):
        if name == "joint":  # the joint planner, memory tight enough for list scheduling
            plat = platform if L == 4 else schedir.Platform.hosts(2, 4, 100e9, 10e9, memory=10)
            sched = solvers.get("pipeline_joint", problem(L, plat)).function(problem(L, plat))
            return sched
        return BASELINES[name](problem(L, platform))

    def check(name: str, L: int, platform, devices=None) -> tuple[list[int], int]:
        """Run one generated schedule on the first L blocks (one block per chunk)."""
        sched = generate(name, L, platform)
        r = run_pipeline(blocks[:L], sched, x, y, mse_loss, devices=devices)
        ref_loss, ref_grads = refs[L]
        checked = []
        for k, (g, ref) in enumerate(zip(r.grads, ref_grads, strict=True)):
            if g is not None:
                for u, v in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(ref),
                                strict=True):  # fmt: skip
                    _close(u, v, f"{name} on {L} blocks: stage {k}")
                checked.append(k)
        if r.loss is not None:
            _close(r.loss, ref_loss, f"{name} on {L} blocks: loss")
        return checked, int(r.loss is not None)

    report = {"processes": jax.process_count(), "devices": len(jax.devices()),
              "local": len(jax.local_devices()), "hosts_8": {}, "loss_8": {},
              "local_4": []}  # fmt: skip
    hosts = schedir.Platform.hosts(2, 4, 100e9, 10e9)  # h{p}/d{k}: process p's k-th device
    mine = schedir.Platform.hosts(1, 4, 100e9, 10e9)
    own = {f"h0/d{k}": d for k, d in enumerate(jax.local_devices())}
    for name in [*BASELINES, "joint"]:
        virtual = name in ("interleaved_1f1b", "v_shape")  # two chunks per device
        checked, has_loss = check(name, 16 if virtual else 8, hosts)
        report["hosts_8"][name], report["loss_8"][name] = checked, has_loss
        L = 8 if virtual else 4
        checked, has_loss = check(name, L, mine, devices=own)
        assert checked == list(range(L)) and has_loss, (name, checked)
        report["local_4"].append(name)
    # SPMD: 8 blocks stacked over a mesh of the 8 devices of both processes
    block_apply, stacked = nnx_blocks(blocks[:8])
    mesh = stage_mesh(8)
    ls, gs = jax.jit(jax.value_and_grad(
        lambda p: mse_loss(sequential(block_apply, p, x), y)))(stacked)  # fmt: skip
    report["spmd"] = []
    sharded = shard_stacked(stacked, mesh)
    for name in ("1f1b", "zb_h1"):
        orders = stage_orders(BASELINES[name](problem(8, hosts)))
        lp, gp = spmd_value_and_grad(block_apply, mse_loss, sharded, x, y, mesh, orders)
        _close(lp.addressable_data(0), ls, f"spmd {name} loss")
        for got, ref in zip(jax.tree_util.tree_leaves(gp), jax.tree_util.tree_leaves(gs),
                            strict=True):  # fmt: skip
            for shard in got.addressable_shards:
                _close(shard.data, ref[shard.index], f"spmd {name} gradients")
        report["spmd"].append(name)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    _child()
