"""Train a Flax NNX model with optax under an activation-memory budget.

The schedule is applied as a model transformation: ``jax_exec.lower`` turns the layers,
the loss and a schedule into a pure ``loss(params, x, y)`` whose autodiff follows the
schedule (nested ``jax.checkpoint``). Any training loop can use it in place of the
plain loss; here a few optax steps, checked against the plain loss step by step, and
the trained parameters written back into the NNX modules.

Run: ``.venv/bin/python examples/optax_training.py``.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx

import jax_exec
import solvers
from jax_exec.models import mlp_stack, mse_loss


def main() -> None:
    layers = mlp_stack(depth=8, width=64, hidden=256, in_dim=32, out_dim=8, seed=0)
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (256, 32))
    y = jax.random.normal(ky, (256, 8))

    # 1. Profile, and solve for half of what storing everything would need.
    chain = jax_exec.profile(layers, mse_loss, x, y, timing="flops")
    store_all = solvers.solve(chain, 10**15, "store_all").meta["peak_memory"]
    schedule = solvers.solve(chain, store_all // 2, method="rotor")
    print(
        f"{chain.length} stages: store-all needs {store_all / 1e6:.2f} MB of activations, "
        f"the rotor schedule {schedule.meta['peak_memory'] / 1e6:.2f} MB "
        f"(predicted time x{schedule.meta['makespan'] / chain.store_all_time():.2f})"
    )

    # 2. The schedule as a model transformation: a pure loss of (params, x, y).
    lowered = jax_exec.lower(layers, mse_loss, schedule)
    params = lowered.params()  # one nnx.State of nnx.Param per layer

    def plain_loss(params, x, y):
        a = x
        for stage, p in zip(lowered.stages, params, strict=True):
            a = stage.apply(p, stage.rest, a)
        return mse_loss(a, y)

    optimizer = optax.adamw(1e-3)

    def make_step(loss_fn):
        @jax.jit
        def step(params, opt_state):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return step

    scheduled_step, plain_step = make_step(lowered.loss), make_step(plain_loss)
    p_sched, s_sched = params, optimizer.init(params)
    p_plain, s_plain = params, optimizer.init(params)
    for i in range(5):
        p_sched, s_sched, loss = scheduled_step(p_sched, s_sched)
        p_plain, s_plain, plain = plain_step(p_plain, s_plain)
        print(f"step {i}: loss {float(loss):.6f} (plain {float(plain):.6f})")
    for a, b in zip(jax.tree.leaves(p_sched), jax.tree.leaves(p_plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    print("parameters after 5 steps equal those of the plain training loop")

    # 3. Write the trained parameters back into the NNX modules.
    for layer, p in zip(layers, p_sched, strict=True):
        nnx.update(layer, p)
    loss, _ = jax_exec.value_and_grad(layers, mse_loss, schedule)(x, y)  # reads the layers
    print(f"loss of the updated NNX model: {float(loss):.6f}")


if __name__ == "__main__":
    main()
