"""The drop-in on the model zoo (tests/zoo: tiny models written as the public Flax NNX
implementations of well-known architectures are). Per family, at a budget: ``plan`` run
op by op (measured peak = predicted <= budget) and compiled (``Plan.lowered`` under
``jax.jit``, which ``value_and_grad`` runs eagerly on the same schedule), and
``jax_exec.value_and_grad`` eagerly, under ``nnx.jit`` and with ``has_aux`` (metrics
holding the loss) under ``nnx.jit``: loss, gradients and state equal plain
``nnx.value_and_grad`` (tests/plain_reference.py); the compiled step saves the residuals
``expected_residuals`` predicts. The default run covers one budget per
family (store-all, 80% or 65% of it by turns; the least budget where that is below it);
``-m slow`` covers store-all, the least budget and two between, on every path."""

from __future__ import annotations

import pytest
import zoo
from flax import nnx
from plain_reference import assert_matches, check_plan, model_state, plain

import jax_exec
import solvers
from jax_exec.execute.lowering import expected_residuals, saved_residuals

FAMILIES = sorted(zoo.FAMILIES)
TURNS = ("100%", "80%", "65%")


def planned(case, budget):
    """A plan at ``budget``, or at the least budget when that is above it."""
    try:
        return jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget=budget)
    except solvers.Infeasible as err:
        return jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget=err.min_budget)


def check_residuals(case, p, what: str) -> None:
    """What the compiled step saves at its top level is what ``expected_residuals``
    predicts (loops kept: stacked residuals; a Segment whose first forward loops saves
    the stacked constants it slices; weakly typed inputs are saved as the strongly
    typed values the blocks read)."""
    _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
    got = saved_residuals(p.lowered(), params, rest, case.args)
    want = expected_residuals(p.model, p.schedule)
    assert got == want, f"{what}: saved {dict(got - want)} beyond, {dict(want - got)} short"


def check_drop_in(case, p, reference, what: str) -> None:
    """value_and_grad at plan ``p``'s budget (one meaning of a budget on every path)
    eagerly and under nnx.jit. It makes ``p``'s schedule, and its eager call runs
    ``p.lowered()`` under ``jax.jit``: ``p``'s compiled path (check_plan's, which the
    callers skip: each compile of a zoo step takes 0.5-1 s)."""
    vg = jax_exec.value_and_grad(case.loss_fn, budget=p.budget)
    model = case.factory()
    loss, grads = vg(model, *case.args)  # eager
    assert vg.plan.schedule.ops == p.schedule.ops, f"{what}: value_and_grad planned otherwise"
    assert_matches(loss, grads, model_state(model), reference, f"{what}, eager (compiled)")
    model = case.factory()
    loss, grads = nnx.jit(vg)(model, *case.args)
    assert_matches(loss, grads, model_state(model), reference, f"{what}, nnx.jit")
    assert len(vg.plans) == 1 and vg.plan.budget == p.budget  # one plan, reused


@pytest.mark.parametrize("family", FAMILIES)
def test_family_at_one_budget(family):
    case = zoo.case(family)
    # one plain step for both references: aux_loss_fn's loss is loss_fn's (the zoo's
    # contract), so its loss, gradients and state are the reference of both
    aux_reference = plain(case.factory, case.aux_loss_fn, case.args, has_aux=True)
    loss, _, grads, state = aux_reference
    reference = (loss, None, grads, state)
    p = planned(case, TURNS[FAMILIES.index(family) % len(TURNS)])
    what = f"{family} at {p.budget:,} B ({p.budget / p.store_all_peak:.0%})"
    check_plan(case, p, reference, what, compiled=False)  # compiled: check_drop_in
    check_residuals(case, p, what)
    check_drop_in(case, p, reference, what)
    vg = jax_exec.value_and_grad(case.aux_loss_fn, budget=p.budget, has_aux=True)
    model = case.factory()
    try:  # its metrics may need more memory than the loss alone
        (loss, aux), grads = nnx.jit(vg)(model, *case.args)
    except solvers.Infeasible as err:
        vg = jax_exec.value_and_grad(case.aux_loss_fn, budget=err.min_budget, has_aux=True)
        (loss, aux), grads = nnx.jit(vg)(model, *case.args)
    assert_matches(loss, grads, model_state(model), aux_reference, f"{what}, has_aux", aux)
    assert float(aux["loss"]) == float(loss)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_family_from_store_all_to_the_least_budget(family):
    case = zoo.case(family)
    reference = plain(case.factory, case.loss_fn, case.args)
    top = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="100%")
    least = top.least_budget()
    budgets = sorted({top.budget, least, *(least + (top.budget - least) * i // 3 for i in (1, 2))})
    for budget in budgets:
        p = top.replan(budget)
        what = f"{family} at {budget:,} B ({budget / top.store_all_peak:.0%})"
        check_plan(case, p, reference, what, compiled=False)  # compiled: check_drop_in
        check_residuals(case, p, what)
        check_drop_in(case, p, reference, what)
