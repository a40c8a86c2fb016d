"""One ZB-H1 training step of an MLP pipelined over every device of every process.

Run it as N local CPU processes (docs/multihost.md):

    schedir launch --processes 2 --devices-per-process 4 -- python examples/multihost_pipeline.py

or on a cluster with one process per host (the SLURM script of docs/multihost.md). Alone
(``python examples/multihost_pipeline.py``) it runs on the devices of one process. Each
process prints the stages it ran and their gradients' agreement with the single-device
model, and the process holding the last stage prints the loss.
"""

from __future__ import annotations

from jax_exec.distributed import initialize_from_env

group = initialize_from_env()  # before anything touches a device

import jax  # noqa: E402
import numpy as np  # noqa: E402

import schedir  # noqa: E402
from jax_exec.pipeline.mpmd import run_pipeline  # noqa: E402
from jax_exec.stages import as_stages  # noqa: E402
from schedir.pipeline.baselines import zb_h1  # noqa: E402
from schedir.pipeline.problem import PipelineProblem  # noqa: E402
from schedir_cli.models import mlp_stack, mse_loss  # noqa: E402

hosts, per_host = jax.process_count(), len(jax.local_devices())
P = hosts * per_host
layers = mlp_stack(P - 2, 16, 32, 8, 4) if P > 2 else mlp_stack(1, 16, 32, 8, 4)
L = len(layers)
x = jax.random.normal(jax.random.key(0), (4 * P, 8))  # the same batch in every process
y = jax.random.normal(jax.random.key(1), (4 * P, 4))

# devices h{p}/d{k}: run_pipeline puts them on process p's k-th device
platform = schedir.Platform.hosts(hosts, per_host, 100e9, 10e9, inter_latency=1e-5)
chain = schedir.Chain.from_rotor([1.0] * L, [1.0] * (L + 1), [1] * (L + 1), [0] + [1] * L,
                                 [0] * L, [0] * (L + 1))  # fmt: skip
devices = [d.name for d in platform.devices][: min(P, L)]
schedule = zb_h1(PipelineProblem(chain, [0] * L, platform, P, True), devices)
result = run_pipeline(layers, schedule, x, y, mse_loss)

stages = as_stages(layers)


def loss(params):
    a = x
    for s, p in zip(stages, params, strict=True):
        a = s.apply(p, s.rest, a)
    return mse_loss(a, y)


ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss))([s.params for s in stages])
mine = [k for k, g in enumerate(result.grads) if g is not None]
worst = max(
    float(np.max(np.abs(np.asarray(u) - np.asarray(v)) / (np.abs(np.asarray(v)).max() + 1e-30)))
    for k in mine
    for u, v in zip(
        jax.tree_util.tree_leaves(result.grads[k]),
        jax.tree_util.tree_leaves(ref_grads[k]),
        strict=True,
    )  # fmt: skip
)
rank = group.process_id if group else 0
print(f"process {rank}: stages {mine}, largest relative gradient difference {worst:.1e}")
if result.loss is not None:
    print(f"process {rank}: loss {float(result.loss):.6f} (one device: {float(ref_loss):.6f})")
