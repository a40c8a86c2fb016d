"""Train a Flax NNX language model with optax under an activation-memory budget.

The schedule is applied as a model transformation: ``jax_exec.lower`` turns the layers,
the loss and a schedule into a pure ``loss(params, x, y)`` whose autodiff follows the
schedule (nested ``jax.checkpoint``). Any training loop can use it in place of the
plain loss; here a few adamw steps, checked against the plain ``nnx.Sequential``
trained the same way, and the trained parameters written back into the NNX modules.

The model has integer token inputs and a tied embedding: the head projects onto the
embedding table (``embed.attend``). The table is one ``nnx.Param`` read by two layers;
``lowered.params()`` holds it once (in the embedding layer), and its gradient is the
sum over both uses, so the optimizer updates it once, as in the plain model.

Run: ``.venv/bin/python examples/optax_training.py``.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx

import jax_exec
import solvers
from schedir_cli.models import MLPBlock

VOCAB, WIDTH = 64, 32


class TiedHead(nnx.Module):
    """Logits against the embedding table (weights tied with the input embedding)."""

    def __init__(self, embed: nnx.Embed, *, rngs: nnx.Rngs) -> None:
        self.embed = embed
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.embed.attend(self.norm(x))


def xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer targets."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def main() -> None:
    rngs = nnx.Rngs(0)
    embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
    layers = [embed, *(MLPBlock(WIDTH, 4 * WIDTH, rngs=rngs) for _ in range(6))]
    layers.append(TiedHead(embed, rngs=rngs))
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.randint(kx, (64, 32), 0, VOCAB)  # token ids
    y = jax.random.randint(ky, (64, 32), 0, VOCAB)  # next tokens

    # 1. Profile, and solve for half of what storing everything would need.
    chain = jax_exec.stages.profile(layers, xent, x, y, timing="flops")
    store_all = solvers.solve(chain, 10**15, "store_all").meta["peak_memory"]
    schedule = solvers.solve(chain, store_all // 2, method="rotor")
    print(
        f"{chain.length} stages: store-all needs {store_all / 2**20:.2f} MiB of activations, "
        f"the rotor schedule {schedule.meta['peak_memory'] / 2**20:.2f} MiB "
        f"(predicted time x{schedule.meta['makespan'] / chain.store_all_time():.2f})"
    )

    # 2. The schedule as a model transformation: a pure loss of (params, x, y).
    lowered = jax_exec.stages.lower(layers, xent, schedule)
    params = lowered.params()  # one nnx.State of nnx.Param per layer, the table once

    # The plain model, trained the same way from the same parameters.
    model = nnx.Sequential(*layers)
    graphdef, plain_params, rest = nnx.split(model, nnx.Param, ...)
    plain_params = jax.tree.map(lambda v: v, plain_params)  # a copy

    def plain_loss(params, x, y):
        return xent(nnx.merge(graphdef, params, rest, copy=True)(x), y)

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
    p_plain, s_plain = plain_params, optimizer.init(plain_params)
    for i in range(5):
        p_sched, s_sched, loss = scheduled_step(p_sched, s_sched)
        p_plain, s_plain, plain = plain_step(p_plain, s_plain)
        print(f"step {i}: loss {float(loss):.6f} (plain {float(plain):.6f})")

    # 3. Write the trained parameters back into the NNX modules (the table once), and
    # check the whole model against the plain training loop.
    for layer, p in zip(layers, p_sched, strict=True):
        nnx.update(layer, p)
    trained = nnx.state(model, nnx.Param)
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(p_plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    print("parameters after 5 steps equal those of the plain training loop")
    loss, _ = jax_exec.stages.value_and_grad(layers, xent, schedule)(x, y)  # reads the layers
    print(f"loss of the updated NNX model: {float(loss):.6f}")


if __name__ == "__main__":
    main()
