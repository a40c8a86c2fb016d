"""``jax_exec.plan(method=...)`` with every chain and graph method, and the planner at
half of the store-all peak against JAX's policies and the whole-graph MILP.

Oracles: plain ``nnx.value_and_grad`` (loss, gradients, model state), the simulators
of the problem each method solved (the block chain, or the block graph of
``schedir.blocks.graph``) for the op-by-op runtime's live bytes and needs, and JAX's
account of the compiled step's residuals for chain schedules.
"""

from __future__ import annotations

import jax
import pytest
from auto_models import make_mlp
from flax import nnx
from test_auto_plan import assert_close, reference

import jax_exec
import solvers
from jax_exec.auto.methods import CHAIN_METHODS, GRAPH_METHODS
from jax_exec.execute.lowering import expected_residuals, saved_residuals
from schedir import GraphSchedule, simulate

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)

ALL = (*CHAIN_METHODS, *(m if m not in CHAIN_METHODS else f"graph:{m}" for m in GRAPH_METHODS))


@pytest.fixture(scope="module")
def small():
    factory, loss_fn, args = make_mlp(depth=2)
    return factory, loss_fn, args, reference(factory, loss_fn, args)


def test_every_chain_and_graph_method_runs_as_predicted(small):
    """Each method at a budget it meets and at a tighter one where it has a schedule:
    the op-by-op run measures the simulator's bytes after every op, and the step
    equals the plain one; chain schedules also lower to the compiled path."""
    factory, loss_fn, args, ref = small
    base = jax_exec.plan(loss_fn, factory(), *args, budget="100%")
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    ran = set()
    for method in ALL:
        for budget in (10**9, "60%"):
            try:
                p = base.replan(budget, method=method)
            except solvers.Infeasible as err:
                assert budget != 10**9, method
                assert err.min_budget is None or err.min_budget > base.store_all_peak * 0.6
                continue
            result = p.run(factory(), *args)
            trace = simulate(p.problem, p.schedule)
            assert result.resident_bytes == trace.resident, method
            assert result.op_peak_bytes == trace.op_peak, method
            assert result.peak_bytes == p.schedule.meta["peak_memory"] <= p.budget
            assert_close(result.loss, ref[0])
            assert_close(result.grads, ref[1])
            assert_close(result.new_state, ref[2])
            if isinstance(p.schedule, GraphSchedule):
                with pytest.raises(ValueError, match="runs op by op only"):
                    p.lowered()
            elif budget != 10**9:
                fn = p.lowered()
                c_loss, c_grads = jax.value_and_grad(fn, has_aux=True)(params, rest, args)
                assert_close(c_grads, ref[1])
                got = saved_residuals(fn, params, rest, args)
                assert got == expected_residuals(p.model, p.schedule), method
            ran.add(method)
    assert ran == set(ALL)
    with pytest.raises(ValueError, match="graph method's schedule runs op by op"):
        jax_exec.value_and_grad(loss_fn, budget="50%", method="dtr")
    with pytest.raises(ValueError, match="method = 'nope': expected one of .*checkmate_milp"):
        base.replan("50%", method="nope")


def test_half_budget_planner_vs_policies_and_milp():
    """At 50% of the store-all peak (a model where it is feasible): the planner's
    predicted overhead is no worse than the best JAX policy that fits, and its makespan
    within 5% of the whole-graph MILPs', solved to optimality: Checkmate's MILP on the
    block graph (each block recomputed from its input in its backward) and the
    equation-level save-set MILP (``whole_milp``), which ``auto`` also solves here."""
    factory, loss_fn, args = make_mlp(depth=4)
    p = jax_exec.plan(loss_fn, factory(), *args, budget="50%")
    policies = []
    for policy in ("checkpoint_dots", "nothing_saveable", "everything_saveable"):
        try:
            policies.append(p.replan(p.budget, method=policy))
        except solvers.Infeasible:
            continue
    assert policies  # some policy fits: the comparison is not vacuous
    assert p.overhead <= min(q.overhead for q in policies) + 1e-12
    milp = p.replan(p.budget, method="checkmate_milp", graph_option="nothing_saveable",
                    time_limit=60)  # fmt: skip
    assert milp.schedule.meta["status"] == "optimal" and milp.schedule.meta["exact"]
    assert p.schedule.meta["makespan"] <= 1.05 * milp.schedule.meta["makespan"]
    whole = p.replan(p.budget, method="whole_milp", time_limit=60)
    assert whole.schedule.meta["whole_milp"]["optimal"]
    assert "whole_milp" in p.schedule.meta  # the fallback ran (a small graph)
    assert p.schedule.meta["makespan"] <= 1.05 * whole.schedule.meta["makespan"]
