"""The whole-graph save-set MILP on traced models (``method="whole_milp"``) and
``auto``'s fallback to it on small graphs.

Oracles: plain ``nnx.value_and_grad`` (loss, gradients, model state), the block
chain's simulator for the op-by-op runtime's bytes, JAX's account of the compiled
step's residuals (``check_plan``), and the block DP alone for what the fallback adds.
"""

from __future__ import annotations

import pytest
from auto_models import make_gpt, make_scan
from test_auto_plan import check_plan, reference

import solvers
from jax_exec import auto
from jax_exec.auto.whole import groups
from schedir import F_all

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def gpt():
    factory, loss_fn, args = make_gpt()  # tied embeddings, dropout, integer tokens
    base = auto.plan(loss_fn, factory(), *args, budget="100%", whole_graph=0)
    return factory, loss_fn, args, reference(factory, loss_fn, args), base


@pytest.mark.parametrize("fraction", ["60%", "85%"])
def test_whole_milp_plans_run_as_predicted(gpt, fraction):
    factory, loss_fn, args, ref, base = gpt
    p = base.replan(fraction, method="whole_milp")
    info = p.schedule.meta["whole_milp"]
    assert info["variables"] > 0 and info["rounds"] >= 1 and info["solve_time"] >= 0
    # one recording per block, each block recomputing inside its own backward
    assert [type(op) for op in p.schedule.ops[: p.model.length]] == [F_all] * p.model.length
    check_plan(p, factory, loss_fn, args, ref)


def test_auto_keeps_the_faster_of_the_block_dp_and_the_whole_graph_milp(gpt):
    factory, loss_fn, args, ref, base = gpt
    for fraction in ("60%", "85%"):
        dp = base.replan(fraction, whole_graph=0)
        assert "whole_milp" not in dp.schedule.meta
        whole = base.replan(fraction, method="whole_milp")
        p = base.replan(fraction, whole_graph=10_000)
        info = p.schedule.meta["whole_milp"]
        assert p.schedule.meta["makespan"] <= dp.schedule.meta["makespan"] * (1 + 1e-12)
        if not info["found"]:  # its first answer was no faster than the DP's: not compiled
            assert info["why"] == "its answer is no faster than the block DP's"
        else:
            best = min(dp.schedule.meta["makespan"], whole.schedule.meta["makespan"])
            assert p.schedule.meta["makespan"] <= best * (1 + 1e-12)
            if not info.get("mixed"):  # else the DP did better with the MILP's save sets
                faster = whole.schedule.meta["makespan"] < dp.schedule.meta["makespan"]
                assert info["chosen"] == faster
        assert p.base is base.base  # replans start from the blocks' own options
        assert len(dp.model.options[0]) == len(base.model.options[0])
        check_plan(p, factory, loss_fn, args, ref, compiled=fraction == "60%")


def test_the_fallback_is_for_small_graphs_only(gpt):
    _, _, _, _, base = gpt
    assert "whole_milp" not in base.replan("85%", whole_graph=1).schedule.meta
    factory, loss_fn, args, _, _ = gpt
    with pytest.raises(ValueError, match="whole_graph = -1"):
        auto.plan(loss_fn, factory(), *args, budget="85%", whole_graph=-1)


def test_below_the_whole_graph_models_reach_it_says_so(gpt):
    _, _, _, _, base = gpt
    with pytest.raises(solvers.Infeasible) as err:
        base.replan(1, method="whole_milp")
    assert err.value.min_budget is None  # the MILP's model is an estimate: no least claimed
    assert "whole_milp" in str(err.value)


def test_scanned_blocks_share_their_save_set():
    factory, loss_fn, args = make_scan()
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="60%", method="whole_milp")
    ids, options = groups(p.model), p.options
    shared = [g for g in set(ids) if ids.count(g) > 1]
    assert shared  # the scanned layers
    for g in shared:
        assert len({options[k] for k, i in enumerate(ids) if i == g}) == 1
    check_plan(p, factory, loss_fn, args, ref)
