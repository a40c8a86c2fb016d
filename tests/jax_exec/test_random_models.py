"""The drop-in on seeded random models (tests/random_models.py): every one plans and runs
on both paths at a random budget, with the loss, gradients and state of plain
``nnx.value_and_grad``; none crashes.

Per model: ``plan`` at store-all, then a budget drawn between the least budget of the
problem as first estimated (a range to draw from, not a claim) and store-all; where that
is below the exact least budget, the ``Infeasible`` error's ``min_budget`` (exact) is
planned instead, so the least budgets are covered too. The plan runs op by op (measured
peak = predicted <= budget) and compiled (``Plan.lowered`` under ``jax.jit``); every
tenth model also through ``jax_exec.value_and_grad`` with ``has_aux`` (metrics holding
the loss) eagerly.

Tolerance: plain_reference.RTOL (1e-5 of the largest gradient leaf's norm). The only
differences seen are float32 rounding: a schedule that recomputes a block, or lowers it
inside a ``custom_vjp``, lets XLA fuse and reassociate its sums otherwise than the plain
step does (seen up to 2e-6 of the scale). Ties in a ``max`` would split the gradient
differently in a recomputed block, which is not rounding: the generator draws maxima of
continuous values, which have none.
"""

from __future__ import annotations

import pytest
from plain_reference import assert_matches, check_plan, model_state, plain
from random_models import random_case

import jax_exec
import solvers
from solvers.blocks.rotor import least_memory

MODELS, CHUNKS = 300, 10


def check(seed: int) -> None:
    case = random_case(seed)
    what = f"random model {seed} {case.ops}"
    reference = plain(case.factory, case.loss_fn, case.args)
    top = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="100%")
    low = min(least_memory(top.problem)[0], top.budget)
    budget = low + int((top.budget - low) * case.fraction)
    try:
        p = top.replan(budget)
    except solvers.Infeasible as err:
        p = top.replan(err.min_budget)
    what += f" at {p.budget:,} B ({p.budget / top.budget:.0%} of store-all)"
    check_plan(case, p, reference, what)
    if seed % 10 == 0:
        vg = jax_exec.value_and_grad(case.aux_loss_fn, budget=p.budget, has_aux=True)
        model = case.factory()
        try:  # its metrics may need more memory than the loss alone
            (loss, aux), grads = vg(model, *case.args)
        except solvers.Infeasible as err:
            vg = jax_exec.value_and_grad(case.aux_loss_fn, budget=err.min_budget, has_aux=True)
            (loss, aux), grads = vg(model, *case.args)
        aux_reference = plain(case.factory, case.aux_loss_fn, case.args, has_aux=True)
        assert_matches(loss, grads, model_state(model), aux_reference, f"{what}, has_aux", aux)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_models(chunk):
    for seed in range(chunk, MODELS, CHUNKS):
        check(seed)
