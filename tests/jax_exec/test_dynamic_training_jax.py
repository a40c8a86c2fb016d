"""Dynamic training in JAX on 4 CPU devices (one subprocess for every policy: XLA_FLAGS
must be set before jax is imported, and the kernels compile once for all runs).

Every policy's step gives the single-device loss and gradients (rtol 1e-5) and never
holds more than a device's cap (the bytes of the arrays the runtime keeps there,
measured after every task); offloading and dropping with recomputation both run;
the speed and noise knobs stretch task times as the simulator's model says; no run's
throughput exceeds the LP bound of its own measured durations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ["eager", "dmda", "dmdas", "heft", "guided"]


def test_every_policy_trains_exactly_within_the_memory_caps():
    from xla_env import device_flags  # tests/ is not on the child's path

    env = dict(
        os.environ,
        XLA_FLAGS=device_flags(4),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    )
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 4
    assert set(report["checked"]) == {*POLICIES, "offload", "knobs"}
    assert report["modes"]["drop"] and report["modes"]["offload"]


def _child() -> None:  # pragma: no cover - runs in the subprocess
    from collections import Counter

    import jax
    from jax_reference import assert_trees_close, plain_value_and_grad

    from jax_exec.pipeline.dynamic_training import run_dynamic_training
    from schedir.dynamic import task_factors
    from schedir.pipeline.simulate import Noise
    from schedir_cli.models import mlp_stack, mse_loss
    from solvers.pipeline.training_lp import bound_of_trace

    assert len(jax.devices()) == 4
    layers = mlp_stack(2, 16, 64, 16, 8)  # 4 stages; stashes of 5 to 124 KB per micro-batch
    x = jax.random.normal(jax.random.key(0), (512, 16))
    y = jax.random.normal(jax.random.key(1), (512, 8))
    ref_loss, ref_grads = plain_value_and_grad(layers, mse_loss)(x, y)
    cap = 300_000  # a third of what dmda holds unconstrained on its busiest device
    checked, modes = [], Counter()

    def check(name, r, cap):
        assert_trees_close(r.loss, ref_loss, name)
        assert_trees_close(r.grads, ref_grads, name)
        assert len(r.measured_bytes) == len(r.trace.graph.tasks), name
        worst = max(b for snapshot in r.measured_bytes for b in snapshot.values())
        assert worst <= cap and max(r.device_peaks.values()) <= cap, (name, worst)
        # what the runtime counted bounds what it measured
        assert all(r.device_peaks[u] <= r.trace.device_peak[u] for u in r.device_peaks), name
        bound = bound_of_trace(r.trace.graph, r.trace.platform, r.trace, links=False)
        assert 8 / r.makespan <= bound.throughput * (1 + 1e-9), name
        modes.update(mode for *_, mode in r.trace.evictions)
        checked.append(name)

    for policy in POLICIES:
        r = run_dynamic_training(layers, x, y, mse_loss, policy=policy, microbatches=8,
                                 memory=cap)  # fmt: skip
        check(policy, r, cap)
    r = run_dynamic_training(layers, x, y, mse_loss, policy="dmdas", microbatches=8,
                             memory=cap, host_bandwidth=1e9)  # fmt: skip
    check("offload", r, cap)
    # the knobs: device 0 twice as fast, 30% seeded noise per task and per device
    noise = Noise(0.3, 1, 0.3)
    r = run_dynamic_training(layers, x, y, mse_loss, policy="dmda", microbatches=8,
                             memory=400_000, speeds=[2, 1, 1, 1], noise=noise,
                             time_scale=4.0)  # fmt: skip
    g = r.trace.graph
    factors = task_factors(noise, len(g.tasks))
    dev = noise.device_factors(list(r.placement))
    speed = {"dev0": 2.0, "dev1": 1.0, "dev2": 1.0, "dev3": 1.0}
    for t, task in enumerate(g.tasks):
        u = r.trace.device[t]
        target = task.work / speed[u] * factors[t] * dev[u]
        assert r.trace.duration[t] >= target * (1 - 1e-6), (task.name, u)
    check("knobs", r, 400_000)
    print(json.dumps({"devices": len(jax.devices()), "checked": checked, "modes": modes}))


if __name__ == "__main__":
    _child()
