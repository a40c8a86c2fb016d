"""ZeRO on 8 CPU devices, one subprocess for every check (XLA_FLAGS must be set before
jax is imported): a small GPT-style NNX model trained 3 adamw steps

- under each ZeRO stage 0-3, and stage 2 with the optimizer state in host memory
  (ZeRO-Offload), gives the parameters of the plain single-device optax loop (rtol
  1e-5), and the bytes each device holds for parameters, gradients and optimizer state
  (device memory; host memory for the offloaded state), measured from the arrays'
  addressable shards, equal schedir.training_state's prediction to the byte;
- under the device planner (jax_exec.plan_device) with a budget only ZeRO-3
  fits (below what plain data parallelism needs even at its least activation budget):
  the planner picks the fastest strategy that fits, the executed step (parameters
  gathered per block, the activation schedule per device) gives the plain loop's
  parameters, its measured state bytes equal the prediction, the op-by-op activation
  peak equals the plan's, and their sum fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 8


@pytest.fixture(scope="module")
def report() -> dict:
    from xla_env import device_flags  # tests/ is not on the child's path

    env = dict(os.environ, XLA_FLAGS=device_flags(DEVICES),
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))  # fmt: skip
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_zero_stages_match_the_unsharded_loop_and_the_byte_prediction(report):
    assert report["devices"] == DEVICES
    assert sorted(report["checked"]) == ["0", "1", "2", "2+offload", "3"]
    per_stage = report["bytes"]  # stage -> [params, grads, opt_state] per device
    assert per_stage["0"][2] > per_stage["1"][2]  # stage 1 shards the optimizer state
    assert per_stage["1"][1] > per_stage["2"][1]  # stage 2 the gradients
    assert per_stage["2"][0] > per_stage["3"][0]  # stage 3 the parameters


def test_offloaded_optimizer_state_lives_in_host_memory(report):
    off = report["offload"]
    assert off["device_opt_state"] == 0 and off["host_opt_state"] == off["predicted_host"] > 0
    assert set(off["memory_kinds"]) == {"pinned_host"}
    # what the CPU backend shows: XLA counts host-memory arguments with the device's
    assert off["memory_analysis"]["host_argument_size_in_bytes"] == 0


def test_device_plan_fits_where_data_parallelism_does_not(report):
    dp = report["device_plan"]
    assert dp["budget"] < dp["zero0_least"]  # plain data parallelism never fits
    assert len(dp["fitting_times"]) >= 2  # a choice: ZeRO-3 with and without offload
    assert dp["chosen"] != "ZeRO-0" and dp["chosen_time"] == min(dp["fitting_times"])
    assert dp["stage"] == 3  # the budget only ZeRO-3 fits: parameters gathered per block,
    assert dp["all_gathers"] > dp["split_tensors"]  # again in the backward, not once
    assert dp["measured_state"] == dp["predicted_state"]
    assert dp["measured_activation_peak"] == dp["predicted_activation_peak"]
    assert dp["measured_state"] + dp["measured_activation_peak"] <= dp["predicted_peak"]
    assert dp["predicted_peak"] <= dp["budget"]


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

    import jax_exec
    from jax_exec.zero import measured_bytes, state_bytes, zero_step
    from schedir.training_state import Placement, device_bytes, shard_axis
    from schedir_cli.models import MLPBlock

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

    def check(params):
        for u, v in zip(jax.tree_util.tree_leaves(params), want, strict=True):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)

    checked, per_stage, report = [], {}, {"devices": len(devices)}
    for stage, offload in ((0, False), (1, False), (2, False), (3, False), (2, True)):
        t0 = time.perf_counter()
        name = f"{stage}+offload" if offload else str(stage)
        step = zero_step(loss_fn, optimizer, mesh, stage, offload=offload)
        state = step.init(new_model())
        for batch in batches:  # the step that keeps its gradients, to measure them
            state, _, grads = step.with_grads(state, batch)
        if stage == 0:  # the plain step (same computation, gradients not returned)
            again = step.init(new_model())
            for batch in batches:
                again, _ = step(again, batch)
            check(again.params)
        check(state.params)
        predicted = device_bytes(param_t, opt_t, Placement.zero(stage, offload=offload), DEVICES)
        trees = (state.params, grads, state.opt_state)
        measured = [measured_bytes(t, memory_kind="device") for t in trees]
        host = measured_bytes(state.opt_state, memory_kind="pinned_host")
        for d in devices:
            row = [m[d.id] for m in measured]
            want_row = [predicted.params, predicted.grads, predicted.opt_state]
            assert row == want_row and host[d.id] == predicted.host, (name, d, row, predicted)
        if offload:
            stats = step._jitted(True, state).lower(state, step._batch(batches[0]))
            stats = stats.compile().memory_analysis()
            report["offload"] = {
                "device_opt_state": measured[2][0], "host_opt_state": host[0],
                "predicted_host": predicted.host,
                "memory_kinds": sorted({x.sharding.memory_kind
                                        for x in jax.tree_util.tree_leaves(state.opt_state)}),
                "memory_analysis": {k: int(getattr(stats, k)) for k in (
                    "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                    "host_argument_size_in_bytes", "host_output_size_in_bytes",
                    "host_temp_size_in_bytes")},
            }  # fmt: skip
        else:
            per_stage[stage] = [predicted.params, predicted.grads, predicted.opt_state]
        checked.append(name)
        print(f"stage {name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    report.update(checked=checked, bytes=per_stage)

    # the device planner: a budget below plain data parallelism's least, above the least
    t0 = time.perf_counter()

    def loss_xy(model, x, y):
        return loss_fn(model, {"x": x, "y": y})

    xy = [(b["x"], b["y"]) for b in batches]
    kw = dict(optimizer=optimizer, data_parallel=DEVICES, exact=False)
    wide = jax_exec.plan_device(loss_xy, new_model(), *xy[0], budget=10**12, **kw)
    zero0 = wide.alternatives[0]
    assert zero0.strategy.name == "ZeRO-0"
    # a budget where ZeRO-3 fits on the device and no lower stage does, even offloaded:
    # the executed step gathers per block
    three = min(a.min_budget for a in wide.alternatives
                if a.strategy.stage == 3 and a.strategy.placement.opt_state != "host")  # fmt: skip
    others = min(a.min_budget for a in wide.alternatives if a.strategy.stage < 3)
    assert three < others <= zero0.min_budget
    budget = (three + others) // 2
    dp = jax_exec.plan_device(loss_xy, new_model(), *xy[0], budget=budget, **kw)
    fitting = [a.step.step_time for a in dp.alternatives if a.fits]
    chosen, chosen_time = dp.strategy.name, dp.step.step_time
    print(dp.summary(), file=sys.stderr)
    run = dp.run(new_model(), *xy[0])  # makes the chosen plan exact, one step
    state = run.state
    for batch in xy[1:]:
        state, _, _ = run.zero_step.with_grads(state, batch)
    check(state.params)
    hlo = run.zero_step._jitted(True, state).lower(state, run.zero_step._batch(xy[0])).as_text()
    split = [t for t in param_t if shard_axis(t.shape, DEVICES) is not None]
    parts = ("params", "grads", "opt_state")
    measured_state = {d.id: sum(run.measured[p][d.id] for p in parts) for d in devices}
    assert len(set(measured_state.values())) == 1, measured_state
    report["device_plan"] = {
        "budget": budget, "zero0_least": zero0.min_budget, "chosen": chosen,
        "chosen_time": chosen_time, "fitting_times": fitting,
        "measured_state": measured_state[0], "predicted_state": dp.step.state.resident,
        "measured_activation_peak": run.activation_peak,
        "predicted_activation_peak": dp.step.activation_peak,
        "predicted_peak": dp.step.peak_bytes, "stage": dp.strategy.stage,
        "all_gathers": hlo.count("all_gather"), "split_tensors": len(split),
        "overhead": dp.activation_plan.overhead,
    }  # fmt: skip
    print(f"device plan: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    _child()
