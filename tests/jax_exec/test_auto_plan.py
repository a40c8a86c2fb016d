"""jax_exec.auto end to end on models written for these tests (tests/auto_models.py).

For each model and budgets between the least feasible one and store-all's peak, the
oracles are independent of the planner:

- plain ``nnx.value_and_grad(loss_fn)`` on a fresh copy of the model: loss, gradients
  (rtol 1e-5; absolute tolerance 1e-5 of the largest gradient, since gradients that are
  zero in exact arithmetic, e.g. through BatchNorm, are float noise) and the model
  state after the step (BatchNorm statistics, RNG counters);
- the block-chain simulator called on the planner's schedule: the op-by-op runtime's
  live bytes after every op and each op's need equal its ``resident`` and ``op_peak``
  exactly, and the measured peak fits the budget;
- JAX's own account of the residuals the compiled step saves equals the plan's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from auto_models import make_gpt, make_mlp, make_resnet, make_unet
from flax import nnx

import solvers
from jax_exec import auto
from jax_exec.execute.lowering import expected_residuals, saved_residuals
from schedir.blocks.simulate import simulate_blocks


def _arrays(tree):
    def plain(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return [plain(x) for x in jax.tree_util.tree_leaves(tree)]


def assert_close(got, want, rtol=1e-5):
    got, want = _arrays(got), _arrays(want)
    assert len(got) == len(want)
    floats = [np.max(np.abs(np.asarray(w))) for w in want if jnp.issubdtype(w.dtype, jnp.inexact)]
    atol = 1e-5 * max(floats + [0.0]) + 1e-7
    for g, w in zip(got, want, strict=True):
        if jnp.issubdtype(w.dtype, jnp.inexact):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


def reference(factory, loss_fn, args):
    # jitted: eager autodiff compiles one XLA program per primitive (minutes on CPU)
    model = factory()
    loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model, *args)
    return loss, grads, nnx.state(model, nnx.Not(nnx.Param))


def check_plan(p, factory, loss_fn, args, ref, *, compiled=True):
    """The op-by-op run and the compiled step of plan ``p`` against the oracles."""
    result = p.run(factory(), *args)
    trace = simulate_blocks(p.problem, p.schedule)
    assert result.resident_bytes == trace.resident
    assert result.op_peak_bytes == trace.op_peak
    assert result.peak_bytes == p.schedule.meta["peak_memory"] <= p.budget
    loss, grads, state = ref
    assert_close(result.loss, loss)
    assert_close(result.grads, grads)
    assert_close(result.new_state, state)
    if not compiled:
        return
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    fn = p.lowered()
    step = jax.jit(jax.value_and_grad(fn, has_aux=True))
    (c_loss, (_, c_state)), c_grads = step(params, rest, args)
    assert_close(c_loss, loss)
    assert_close(c_grads, grads)
    assert_close(c_state, state)
    assert saved_residuals(fn, params, rest, args) == expected_residuals(p.model, p.schedule)


def sweep(factory, loss_fn, args, fractions, **kw):
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%")
    least = p.least_budget()
    assert 0 < least <= p.store_all_peak
    plans = []
    for f in fractions:
        budget = least + int(f * (p.store_all_peak - least))
        q = p.replan(budget)
        check_plan(q, factory, loss_fn, args, ref, **kw)
        plans.append(q)
    with pytest.raises(solvers.Infeasible) as err:
        p.replan(least - 1)
    assert err.value.min_budget == least
    return plans


def test_mlp_budgets():
    factory, loss_fn, args = make_mlp(depth=2)
    plans = sweep(factory, loss_fn, args, (1.0, 0.0))
    makespans = [q.schedule.meta["makespan"] for q in plans]
    assert makespans == sorted(makespans)  # less memory never makes it faster


def at_policy_peak(factory, loss_fn, args, **kw):
    """The plan at the peak of JAX's ``nothing_saveable`` on every block: a tight budget
    (much recomputation) found without the least feasible one, which compiles every
    option's kernels (``least_budget`` and ``min_budget`` are tested by the sweeps of
    ``test_mlp_budgets`` and, for every model, ``test_every_budget``)."""
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%")
    policy = p.replan(10**15, method="nothing_saveable")
    q = p.replan(policy.schedule.meta["peak_memory"])
    assert q.budget < p.store_all_peak
    assert q.overhead <= policy.overhead + 1e-12  # never slower than the policy at its memory
    check_plan(q, factory, loss_fn, args, ref, **kw)
    return q


def test_gpt_tied_embeddings_dropout_integer_tokens():
    """Dropout draws from nnx.Rngs: recomputed forwards must use the same bits (the
    loss, gradients and RNG counters equal the plain step's)."""
    factory, loss_fn, args = make_gpt(vocab=32, dim=16, heads=2, depth=1, length=8, batch=2)
    at_policy_peak(factory, loss_fn, args)


def test_resnet_batchnorm_statistics_updated_once():
    factory, loss_fn, args = make_resnet(width=4, size=8)
    at_policy_peak(factory, loss_fn, args)


def test_unet_skip_concatenations():
    factory, loss_fn, args = make_unet(width=4, size=8)
    at_policy_peak(factory, loss_fn, args, compiled=False)


@pytest.mark.slow
@pytest.mark.parametrize("make", [make_mlp, make_gpt, make_resnet, make_unet])
def test_every_budget(make):
    factory, loss_fn, args = make()
    sweep(factory, loss_fn, args, (1.0, 0.7, 0.4, 0.1, 0.0))


def test_budget_strings_and_policies():
    factory, loss_fn, args = make_mlp()
    p = auto.plan(loss_fn, factory(), *args, budget="50%", exact=False)
    assert p.budget == p.store_all_peak // 2
    assert p.schedule.meta["peak_memory"] <= p.budget
    full = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    assert 0.0 <= full.overhead <= p.overhead
    for bad in ("50", "x%", -1, 1.5, None):
        with pytest.raises((TypeError, ValueError), match="budget"):
            auto.plan(loss_fn, factory(), *args, budget=bad, exact=False)
    with pytest.raises(ValueError, match="method = 'nope'"):
        auto.plan(loss_fn, factory(), *args, budget="50%", method="nope")
    # JAX's policies on every block, priced by the same simulator: the planner is never worse
    everything = p.replan(10**12, method="everything_saveable")
    assert everything.overhead == 0.0
    assert everything.schedule.meta["peak_memory"] >= p.store_all_peak
    for policy in ("everything_saveable", "checkpoint_dots", "nothing_saveable"):
        try:
            q = p.replan(p.budget, method=policy)
        except solvers.Infeasible as err:
            assert err.min_budget > p.budget
            continue
        assert p.overhead <= q.overhead + 1e-12


def test_saved_residuals_helper_reads_jax():
    """The one private JAX call (jax._src.ad_checkpoint.saved_residuals): a change of its
    location or output format fails here."""

    def f(w, x):
        return jnp.sum(jnp.sin(x @ w))

    w, x = jnp.ones((3, 4)), jnp.ones((2, 3))
    assert saved_residuals(f, w, x) == {((2, 4), "float32"): 1}
    ckpt = jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)
    assert saved_residuals(ckpt, w, x) == {}
