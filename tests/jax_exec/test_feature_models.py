"""The drop-in on models that each use features the zoo does not (tests/feature_models.py:
top-k routing, FFTs, codebooks, associative scans, bfloat16, loops and conds, masked
attention, custom variables, two towers, shared encoders, vmapped ensembles, linear
algebra, shifted windows; tests/feature_models_loops.py: dilated causal convolutions,
CTC, a scanned stack with dropout, a while_loop fixed point; tests/feature_models_losses.py:
derivatives in the loss (a PINN, a gradient penalty), sampling in the loss from a key
argument, map_coordinates; tests/feature_models_heads.py: gradient reversal by
custom_vjp, nnx.Dict heads; tests/feature_models_patterns.py: a second derivative in the
forward, Sinkhorn by fori_loop, segment memory in nnx.Cache, top_k and lax.cond, image
resizing, float16 compute...; tests/feature_models_objectives.py: masked autoencoding,
mixup, policy gradients, PPO's clipped surrogate, a CRF, ALiBi, pixel shuffle...;
tests/feature_models_science.py: complex parameters, a sparse adjacency, Gumbel-softmax,
NeRF rendering, the user's remat with a policy...; tests/feature_models_archs.py: graph
attention by segment ops, a ragged_dot mixture of experts, a DiT, a Conformer,
lax.switch, RWKV, Hyena...). Per model:
``jax_exec.value_and_grad`` eagerly, under ``nnx.jit`` and with ``has_aux`` at
max(65%, least) of store-all, and ``plan`` at the least budget and that budget on both
paths (op by op: measured peak = predicted <= budget): loss, gradients, state and
metrics equal plain ``nnx.value_and_grad``'s (tests/plain_reference.py, the float64
arbiter for ill-conditioned steps). Each found nothing wrong when written except the
FFT model (complex residuals) and the fixed point (refused: a loop no gradient
reaches); their fixes have default-run tests in test_dropin_regressions.py. They are
here under ``-m slow`` so that they stay so (about 5 to 30 s each)."""

from __future__ import annotations

import pytest
from feature_models import CASES as FEATURE_CASES
from feature_models_archs import ARCH_CASES
from feature_models_heads import HEAD_CASES
from feature_models_loops import LOOP_CASES
from feature_models_losses import LOSS_CASES
from feature_models_objectives import OBJECTIVE_CASES
from feature_models_patterns import PATTERN_CASES
from feature_models_science import SCIENCE_CASES
from flax import nnx
from plain_reference import assert_matches, check_plan, float64_reference, model_state, plain

import jax_exec


def _joined(*tables: dict) -> dict:
    """The cases of every table; a name in two of them is an error (the later one would
    silently replace the earlier)."""
    cases: dict = {}
    for table in tables:
        for name in table:
            if name in cases:
                raise ValueError(f"two feature models named {name!r}")
        cases.update(table)
    return cases


CASES = _joined(
    FEATURE_CASES,
    LOOP_CASES,
    LOSS_CASES,
    HEAD_CASES,
    PATTERN_CASES,
    OBJECTIVE_CASES,
    SCIENCE_CASES,
    ARCH_CASES,
)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_feature_model(name):
    case = CASES[name]()
    reference = plain(case.factory, case.loss_fn, case.args)

    def exact():
        return float64_reference(case.factory, case.loss_fn, case.args)

    top = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="100%")
    least = top.least_budget()
    middle = max(least, int(0.65 * top.store_all_peak))
    for how in ("eagerly", "under nnx.jit"):
        step = jax_exec.value_and_grad(case.loss_fn, budget=middle)
        step = step if how == "eagerly" else nnx.jit(step)
        model = case.factory()
        loss, grads = step(model, *case.args)
        assert_matches(loss, grads, model_state(model), reference, f"{name} {how}", exact=exact)
    with_aux = plain(case.factory, case.aux_loss_fn, case.args, has_aux=True)
    model = case.factory()
    step = nnx.jit(jax_exec.value_and_grad(case.aux_loss_fn, budget=middle, has_aux=True))
    (loss, aux), grads = step(model, *case.args)
    assert_matches(loss, grads, model_state(model), with_aux, f"{name} has_aux", aux)
    for budget in (least, middle):
        check_plan(case, top.replan(budget), reference, f"{name} at {budget} B", exact=exact)
