"""Graph solvers: every schedule is valid within budget; LP <= MILP <= the others;
MILP vs rotor on chains; DTR's infeasibility."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import solvers
from schedir import Chain, Graph, chain_to_graph, simulate
from schedir.graph import build_graph, skip_graph
from solvers.checkmate_lp import checkmate_lp
from solvers.checkmate_milp import checkmate_milp
from solvers.dtr import dtr, dtr_chain, dtr_min_budget
from solvers.graph_baselines import chen_sqrt_graph, store_all_graph, store_all_graph_ops

OTHERS = {
    "checkmate_lp": checkmate_lp,
    "dtr": dtr,
    "chen_sqrt": chen_sqrt_graph,
    "store_all": store_all_graph,
}


def small_chain(seed: int, L: int, residuals: bool) -> Chain:
    rng = np.random.default_rng(seed)
    x = [int(v) for v in rng.integers(4, 20, L + 1)]
    extra = rng.integers(1, 10, L) if residuals else np.zeros(L, dtype=int)
    return Chain.from_rotor(
        [round(float(v), 3) for v in rng.uniform(1, 3, L)],
        [round(float(v), 3) for v in rng.uniform(1, 3, L + 1)],
        x,
        [0, *(x[k + 1] + int(extra[k]) for k in range(L))],
        [0] * L,
        [0] * (L + 1),
    )


GRAPHS = {
    "chain4": chain_to_graph(small_chain(0, 4, True)),
    "chain5_nores": chain_to_graph(small_chain(1, 5, False)),
    "resnet6": skip_graph(6, skip=2, seed=1),
    "unet6": skip_graph(6, unet=True, seed=2),
}


def store_all_peak(g: Graph) -> int:
    return simulate(g, store_all_graph_ops(g)).peak_memory


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("fraction", [1.0, 0.75, 0.55])
def test_bounds_and_validity(name: str, fraction: float) -> None:
    g = GRAPHS[name]
    budget = int(store_all_peak(g) * fraction)
    try:
        milp = checkmate_milp(g, budget, time_limit=30)
    except solvers.Infeasible as err:
        assert err.min_budget is not None and err.min_budget > budget
        milp_at_min = checkmate_milp(g, err.min_budget, time_limit=30)
        assert simulate(g, milp_at_min).peak_memory <= err.min_budget
        for fn in OTHERS.values():  # nobody beats the model's least budget
            with pytest.raises(solvers.Infeasible):
                fn(g, budget)
        return
    t = simulate(g, milp)
    assert t.peak_memory <= budget
    assert t.makespan == pytest.approx(milp.meta["milp_objective"], rel=1e-6)
    assert milp.meta["mip_gap"] <= 1e-4 and "HIGHS" in milp.meta["solver"]
    from solvers.checkmate_lp import lp_bound

    assert lp_bound(g, budget) <= t.makespan + 1e-6
    for method, fn in OTHERS.items():
        try:
            s = fn(g, budget)
        except solvers.Infeasible as err:
            assert err.min_budget is None or err.min_budget > budget
            continue
        other = simulate(g, s)
        assert other.peak_memory <= budget, method
        assert t.makespan <= other.makespan + 1e-6, method
        if method == "checkmate_lp":
            assert s.meta["lp_bound"] <= t.makespan + 1e-6


def test_store_all_is_milp_optimum_at_full_budget() -> None:
    g = GRAPHS["resnet6"]
    budget = store_all_peak(g)
    assert simulate(g, checkmate_milp(g, budget)).makespan == pytest.approx(g.store_all_time())
    assert simulate(g, dtr(g, budget)).makespan == pytest.approx(g.store_all_time())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("residuals", [False, True])
def test_milp_never_worse_than_rotor_on_chains(seed: int, residuals: bool) -> None:
    chain = small_chain(10 + seed, 4, residuals)
    g = chain_to_graph(chain)
    top = solvers.solve(chain, 10**9, method="store_all").meta["peak_memory"]
    for fraction in (1.0, 0.7, 0.5):
        budget = int(top * fraction)
        try:
            rotor = solvers.solve(chain, budget, method="rotor").meta["makespan"]
        except solvers.Infeasible:
            continue
        # the graph relaxes the chain model: every rotor schedule is a graph schedule
        milp = simulate(g, checkmate_milp(g, budget)).makespan
        assert milp <= rotor + 1e-6


def test_dtr_infeasible_and_min_budget() -> None:
    g = GRAPHS["unet6"]
    least = dtr_min_budget(g)
    s = dtr(g, least)
    assert simulate(g, s).peak_memory <= least
    with pytest.raises(solvers.Infeasible) as info:
        dtr(g, least - 1)
    assert info.value.min_budget == least
    inputs_only = sum(g.nodes[i].size for i in g.inputs)
    with pytest.raises(solvers.Infeasible):
        dtr(g, inputs_only)


@pytest.mark.parametrize("fraction", [1.0, 0.8, 0.6, 0.5])
def test_dtr_never_exceeds_budget_on_chains(fraction: float) -> None:
    chain = small_chain(3, 8, True)
    g = chain_to_graph(chain)
    budget = int(store_all_peak(g) * fraction)
    try:
        s = dtr_chain(chain, budget)
    except solvers.Infeasible as err:
        assert err.min_budget > budget
        return
    assert simulate(g, s).peak_memory <= budget


def test_input_needed_late_is_kept() -> None:
    g = build_graph(
        [
            {"name": "x", "kind": "input", "cost": 0, "size": 5},
            {"name": "a", "cost": 1, "size": 10, "inputs": ["x"]},
            {"name": "b", "cost": 1, "size": 10, "inputs": ["a"]},
            {"name": "c", "kind": "backward", "cost": 1, "size": 1, "inputs": ["b", "x"]},
        ]
    )
    for fn in (checkmate_milp, checkmate_lp, dtr, chen_sqrt_graph, store_all_graph):
        s = fn(g, 25)  # x + a + b while computing b; then a is freed
        assert simulate(g, s).peak_memory <= 25


@pytest.mark.slow
@pytest.mark.parametrize("L", [6, 8])
def test_milp_vs_rotor_up_to_8_stages(L: int) -> None:
    chain = small_chain(L, L, True)
    g = chain_to_graph(chain)
    top = solvers.solve(chain, 10**9, method="store_all").meta["peak_memory"]
    for fraction in (0.8, 0.6):
        budget = int(top * fraction)
        try:
            rotor = solvers.solve(chain, budget, method="rotor").meta["makespan"]
        except solvers.Infeasible:
            continue
        assert simulate(g, checkmate_milp(g, budget, time_limit=120)).makespan <= rotor + 1e-6


def test_milp_is_exact_whatever_the_time_unit() -> None:
    # Profiled costs are seconds of 1e-7..1e-5: HiGHS's absolute tolerances (1e-6) must
    # not swallow recomputations. The optimum scales with the time unit, and at
    # store-all's own peak it is store-all.
    base = skip_graph(5, skip=2, seed=3)
    peak = simulate(base, store_all_graph_ops(base)).peak_memory
    tiny = Graph(tuple(dataclasses.replace(n, cost=n.cost * 1e-7) for n in base.nodes))
    at_peak = simulate(tiny, checkmate_milp(tiny, peak)).makespan
    assert at_peak == pytest.approx(tiny.store_all_time(), rel=1e-9)
    for budget in (int(peak * 0.8), int(peak * 0.6)):
        try:
            want = simulate(base, checkmate_milp(base, budget)).makespan
        except solvers.Infeasible:
            continue
        got = simulate(tiny, checkmate_milp(tiny, budget)).makespan
        assert got == pytest.approx(want * 1e-7, rel=1e-6)
