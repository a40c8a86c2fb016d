"""Dynamic training on a traced model's block stages (``PipelinePlan.run_dynamic``).

On 4 host CPU devices (a subprocess: XLA_FLAGS must be set before jax is imported):
a small language model with tied embeddings (the embedding read by the first and the
last block stage) is planned by ``plan_pipeline`` and trained one step by the dynamic
runtime, unconstrained and under a memory cap per device that forces evictions: loss
and gradients equal plain ``nnx.value_and_grad`` (tolerance relative to the largest
leaf) and the bytes measured after every task stay within the cap. Under ``-m slow``,
the zoo's decoder LM the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def _run(which: str) -> dict:
    from xla_env import device_flags

    path = os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "jax_exec")])
    env = dict(os.environ, XLA_FLAGS=device_flags(4), JAX_PLATFORMS="cpu", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, __file__, which], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_dynamic_training_of_a_traced_model_matches_plain_within_the_caps():
    report = _run("tiny")
    assert report["checked"] == ["dmda", "eager capped"], report
    assert report["evicted"], report


@pytest.mark.slow
def test_dynamic_training_of_the_zoo_decoder_lm():
    report = _run("decoder_lm")
    assert report["checked"] == ["dmda", "eager capped"], report


def _tiny_case():  # pragma: no cover - runs in the subprocess
    import jax
    import optax
    from flax import nnx

    class TinyLM(nnx.Module):
        def __init__(self, vocab=32, width=16, depth=3, *, rngs):
            self.embed = nnx.Embed(vocab, width, rngs=rngs)
            self.blocks = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

        def __call__(self, tokens):
            h = self.embed(tokens)
            for block in self.blocks:
                h = h + jax.nn.gelu(block(h))
            return self.embed.attend(h)  # tied: the embedding again

    def loss_fn(model, tokens, targets):
        logits = model(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    seq = jax.random.randint(jax.random.key(0), (16, 9), 0, 32)
    return TinyLM(rngs=nnx.Rngs(0)), loss_fn, (seq[:, :-1], seq[:, 1:])


# bytes per device under the cap (fixed: a cap relative to an unconstrained dynamic run
# would follow its timing-dependent placement); the tiny model holds about 60 to 90 kB
# per device unconstrained
CAPS = {"tiny": 36_000, "decoder_lm": 1_100_000}


def _child(which: str) -> None:  # pragma: no cover - runs in the subprocess
    import jax
    from flax import nnx
    from test_traced_pipeline import assert_close, decoder_lm_case

    from jax_exec.parallel import plan_pipeline

    assert len(jax.devices()) == 4
    if which == "tiny":
        model, loss_fn, args = _tiny_case()
    else:
        case, args = decoder_lm_case()
        model, loss_fn = case.factory(), case.loss_fn
    ref_loss, ref_grads = nnx.value_and_grad(loss_fn)(model, *args)
    plan = plan_pipeline(loss_fn, model, *args, devices=4, microbatches=4)
    report: dict = {"checked": [], "evicted": []}
    free = plan.run_dynamic(model, *args, policy="dmda")
    assert_close(free.loss, ref_loss, "dmda: loss")
    assert_close(free.grads, ref_grads, "dmda: gradients")
    report["checked"].append("dmda")
    cap = CAPS[which]
    step = plan.run_dynamic(model, *args, policy="eager", memory=cap)
    assert_close(step.loss, ref_loss, "capped: loss")
    assert_close(step.grads, ref_grads, "capped: gradients")
    worst = max(b for snapshot in step.result.measured_bytes for b in snapshot.values())
    assert worst <= cap, (worst, cap)
    report["evicted"] = sorted({mode for *_, mode in step.result.trace.evictions} - {"free"})
    report["checked"].append("eager capped")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
