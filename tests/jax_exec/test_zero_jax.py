"""ZeRO stages 0-3 on 8 CPU devices (in a subprocess: XLA_FLAGS must be set before jax
is imported): a small GPT-style NNX model trained 3 adamw steps under each stage gives
the parameters of the plain single-device optax loop (rtol 1e-5), and the bytes each
device holds for parameters, gradients and optimizer state, measured from the arrays'
addressable shards, equal schedir.training_state's prediction to the byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 8


def test_zero_stages_match_the_unsharded_loop_and_the_byte_prediction():
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))  # fmt: skip
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == DEVICES
    assert sorted(report["checked"]) == [0, 1, 2, 3]
    per_stage = report["bytes"]  # stage -> [params, grads, opt_state] per device
    assert per_stage["0"][2] > per_stage["1"][2]  # stage 1 shards the optimizer state
    assert per_stage["1"][1] > per_stage["2"][1]  # stage 2 the gradients
    assert per_stage["2"][0] > per_stage["3"][0]  # stage 3 the parameters


def test_bad_inputs_are_refused_by_name():
    pytest.importorskip("jax")
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from jax_exec.zero import split_params, zero_step

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError, match="stage"):
        zero_step(lambda m, b: 0.0, optax.adamw(1e-3), mesh, 4)
    other = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
    with pytest.raises(ValueError, match="'data'"):
        zero_step(lambda m, b: 0.0, optax.adamw(1e-3), other, 1)
    with pytest.raises(ValueError, match="not an nnx.Param"):
        split_params(nnx.BatchNorm(4, rngs=nnx.Rngs(0)))


def _child() -> None:  # pragma: no cover - runs in the subprocess
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jax_exec.models import MLPBlock
    from jax_exec.zero import measured_bytes, state_bytes, zero_step
    from schedir.training_state import Placement, device_bytes

    class Block(nnx.Module):
        """Pre-norm causal self-attention and an MLP. No bias on q, k, v: the key bias
        has a zero gradient (softmax is shift-invariant), which Adam would turn from
        rounding noise into lr-sized updates that no two summation orders agree on."""

        def __init__(self, dim: int, heads: int, *, rngs):
            self.heads = heads
            self.norm = nnx.LayerNorm(dim, rngs=rngs)
            self.qkv = nnx.Linear(dim, 3 * dim, use_bias=False, rngs=rngs)
            self.out = nnx.Linear(dim, dim, rngs=rngs)
            self.mlp = MLPBlock(dim, 2 * dim, rngs=rngs)

        def __call__(self, x):
            b, t, d = x.shape
            qkv = self.qkv(self.norm(x)).reshape(b, t, 3 * self.heads, d // self.heads)
            q, k, v = jnp.split(qkv, 3, 2)
            scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(d // self.heads)
            scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
            mixed = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
            return self.mlp(x + self.out(mixed.reshape(b, t, d)))

    class TinyGPT(nnx.Module):
        """Token and position embeddings, transformer blocks, a LayerNorm and a vocabulary
        head with a bias of 13 (not a multiple of 8: kept replicated)."""

        def __init__(self, vocab: int, tokens: int, dim: int, depth: int, *, rngs):
            self.embed = nnx.Embed(vocab, dim, rngs=rngs)
            self.pos = nnx.Param(jax.random.normal(rngs.params(), (tokens, dim)) * 0.02)
            self.blocks = nnx.List([Block(dim, 2, rngs=rngs)
                                    for _ in range(depth)])  # fmt: skip
            self.norm = nnx.LayerNorm(dim, rngs=rngs)
            self.head = nnx.Linear(dim, vocab, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + self.pos[None]
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    def loss_fn(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    vocab, tokens, dim = 13, 6, 16
    devices = jax.devices()
    assert len(devices) == DEVICES
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    optimizer = optax.adamw(1e-2)
    keys = jax.random.split(jax.random.key(1), 3)
    batches = [{"x": jax.random.randint(k, (16, tokens), 0, vocab),
                "y": jax.random.randint(jax.random.fold_in(k, 1), (16, tokens), 0, vocab)}
               for k in keys]  # fmt: skip

    def new_model():
        return TinyGPT(vocab, tokens, dim, 1, rngs=nnx.Rngs(0))

    # the oracle: the plain optax loop on one device
    model = new_model()
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = optimizer.init(params)

    @jax.jit
    def plain_step(params, opt_state, batch):
        grads = jax.grad(lambda p: loss_fn(nnx.merge(graphdef, p), batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for batch in batches:
        params, opt_state = plain_step(params, opt_state, batch)
    want = jax.tree_util.tree_leaves(params)

    param_t, opt_t = state_bytes(new_model(), optimizer)
    checked, per_stage = [], {}
    for stage in range(4):
        t0 = time.perf_counter()
        step = zero_step(loss_fn, optimizer, mesh, stage)
        state = step.init(new_model())
        for batch in batches:  # the step that keeps its gradients, to measure them
            state, _, grads = step.with_grads(state, batch)
        if stage == 0:  # the plain step (same computation, gradients not returned)
            again = step.init(new_model())
            for batch in batches:
                again, _ = step(again, batch)
            for u, v in zip(jax.tree_util.tree_leaves(again.params), want, strict=True):
                np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)
        got = jax.tree_util.tree_leaves(state.params)
        for u, v in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6,
                                       err_msg=f"stage {stage}")  # fmt: skip
        predicted = device_bytes(param_t, opt_t, Placement.zero(stage), DEVICES)
        measured = [measured_bytes(t) for t in (state.params, grads, state.opt_state)]
        for d in devices:
            row = [m[d.id] for m in measured]
            assert row == [predicted.params, predicted.grads, predicted.opt_state], (
                stage,
                d,
                row,
                predicted,
            )
        per_stage[stage] = [predicted.params, predicted.grads, predicted.opt_state]
        checked.append(stage)
        print(f"stage {stage}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print(json.dumps({"devices": len(devices), "checked": checked, "bytes": per_stage}))


if __name__ == "__main__":
    _child()
