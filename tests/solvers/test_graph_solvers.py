"""Graph solvers: every schedule is valid within budget; LP <= MILP <= the others;
graph methods vs rotor on chains; least budgets; HiGHS's presolve and time limits."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
from brute_force import brute_force_optimum
from graph_cases import random_dag

import solvers
from schedir import Chain, Compute, Free, Graph, InvalidProblem, chain_to_graph, simulate
from schedir.graph.convert import dropped_recorded_inputs
from schedir.graph.generators import skip_graph
from schedir.graph.problem import build_graph
from solvers.graph.baselines import chen_sqrt_graph, store_all_graph, store_all_graph_ops
from solvers.graph.checkmate_lp import checkmate_lp
from solvers.graph.checkmate_milp import checkmate_milp
from solvers.graph.dtr import _dtr_ops, dtr, dtr_chain, dtr_min_budget

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
        return
    t = simulate(g, milp)
    assert t.peak_memory <= budget
    assert t.makespan == pytest.approx(milp.meta["milp_objective"], rel=1e-6)
    assert milp.meta["mip_gap"] <= 1e-4 and "HIGHS" in milp.meta["solver"]
    assert milp.meta["exact"] is True and "time_limited" not in milp.meta
    from solvers.graph.checkmate_lp import lp_bound

    assert lp_bound(g, budget) <= t.makespan + 1e-6
    for method, fn in OTHERS.items():
        try:
            s = fn(g, budget)
        except solvers.Infeasible as err:
            assert err.min_budget is None or err.min_budget > budget
            continue
        other = simulate(g, s)
        assert other.peak_memory <= budget, method
        assert s.meta["exact"] is False, method
        assert t.makespan <= other.makespan + 1e-6, method
        if method == "checkmate_lp":
            assert s.meta["lp_bound"] <= t.makespan + 1e-6


def test_store_all_is_milp_optimum_at_full_budget() -> None:
    g = GRAPHS["resnet6"]
    budget = store_all_peak(g)
    assert simulate(g, checkmate_milp(g, budget)).makespan == pytest.approx(g.store_all_time())
    assert simulate(g, dtr(g, budget)).makespan == pytest.approx(g.store_all_time())


def random_chain(seed: int) -> Chain:
    """Chains of 2-4 stages, with residuals on every stage, on none or on some
    (s_k >= x_{k+1} throughout), temporaries included."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 5))
    x = [int(v) for v in rng.integers(1, 12, L + 1)]
    extra = [rng.integers(1, 8, L), np.zeros(L, dtype=int), rng.integers(0, 6, L)][seed % 3]
    return Chain.from_rotor(
        [round(float(v), 2) for v in rng.uniform(1, 3, L)],
        [round(float(v), 2) for v in rng.uniform(1, 3, L + 1)],
        x,
        [0, *(x[k + 1] + int(extra[k]) for k in range(L))],
        [int(v) for v in rng.integers(0, 4, L)],
        [int(v) for v in rng.integers(0, 4, L + 1)],
    )


GRAPH_METHODS = ("checkmate_milp", "dtr", "checkmate_lp", "chen_sqrt", "store_all")


def graph_methods_vs_rotor(seeds, steps: int, methods=GRAPH_METHODS) -> tuple[int, int]:
    """On random chains at ``steps`` budgets from store-all's peak down, every graph
    method that beats rotor's exact persistent optimum (model="tight") drops a recorded
    input; returns (cases, cases where a graph method beats rotor)."""
    cases = better = 0
    for seed in seeds:
        chain = random_chain(seed)
        g = chain_to_graph(chain)
        top = solvers.solve(chain, 10**9, method="store_all").meta["peak_memory"]
        for budget in np.linspace(top, top // 3, steps).astype(int):
            try:
                rotor = solvers.solve(chain, budget, method="rotor", model="tight")
                best = rotor.meta["makespan"]
            except solvers.Infeasible:
                best = math.inf
            for method in methods:
                try:
                    s = solvers.solve(g, int(budget), method=method)
                except solvers.Infeasible:
                    continue
                cases += 1
                if simulate(g, s).makespan < best - 1e-9:
                    better += 1
                    assert dropped_recorded_inputs(chain, s.ops), (seed, budget, method, s.ops)
    return cases, better


def test_graph_methods_beat_rotor_only_by_dropping_a_recorded_input() -> None:
    """Issue 11, item 4: the graph of a chain is not cheaper to schedule than what runs;
    where a graph method beats rotor, it is by the freedom docs/graphs.md names."""
    cases, _ = graph_methods_vs_rotor(range(9), 4, ("checkmate_milp", "dtr"))
    assert cases >= 20


@pytest.mark.slow
def test_graph_methods_vs_rotor_many_chains() -> None:
    cases, better = graph_methods_vs_rotor(range(9, 150), 8)
    assert cases > 1000 and better > 0


def test_the_freedom_on_a_small_example() -> None:
    """docs/graphs.md's example: 3 stages of unit times, no residuals (s_k = x_{k+1}),
    budget 16. Every persistent chain schedule takes 9 (brute force, rotor tight); the
    graph records stage 1 (F1: a_2 is abar[2]), drops a_1, and later runs B2 and B1
    from that one a_2: 8."""
    chain = Chain.from_rotor([1.0] * 3, [1.0] * 4, [4, 3, 3, 2], [4, 3, 3, 2], [0] * 3, [0] * 4)
    assert brute_force_optimum(chain, 16) == 9.0
    assert solvers.solve(chain, 16, method="rotor", model="tight").meta["makespan"] == 9.0
    g = chain_to_graph(chain)
    names = [n.name for n in g.nodes]
    C = [Compute(names.index(n)) for n in names]
    F = [Free(names.index(n)) for n in names]
    a0, f0, f1, f2, loss, b2, b1, b0 = range(8)
    ops = [C[f0], C[f1], F[f0], C[f2], C[loss], C[b2], F[loss], F[f2], C[f0], C[b1], F[b2],
           F[f1], C[b0], F[b1], F[f0], F[a0], F[b0]]  # fmt: skip
    trace = simulate(g, ops)
    assert (trace.makespan, trace.peak_memory) == (8.0, 16)
    assert dropped_recorded_inputs(chain, ops) == (1,)
    assert solvers.solve(g, 16, method="checkmate_milp").meta["makespan"] == 8.0


def test_dtr_infeasible_and_min_budget() -> None:
    g = GRAPHS["unet6"]
    least = dtr_min_budget(g)
    s = dtr(g, least)
    assert simulate(g, s).peak_memory <= least
    with pytest.raises(solvers.Infeasible) as info:
        dtr(g, least - 1)
    assert info.value.min_budget == least
    assert all(_dtr_ops(g, b) is None for b in range(least))


def test_dtr_min_budget_of_the_issue() -> None:
    """Issue 11, item 12: x is freed once a has run, so 14 bytes suffice (DTR said 20)."""
    g = build_graph(
        [
            {"name": "x", "kind": "input", "cost": 0, "size": 6},
            {"name": "a", "cost": 2.62, "size": 5, "tmp": 3, "inputs": ["x"]},
            {"name": "b", "cost": 2.64, "size": 8, "tmp": 1, "inputs": ["a"]},
        ]
    )
    with pytest.raises(solvers.Infeasible) as info:
        solvers.solve(g, 13, method="dtr")
    assert info.value.min_budget == 14
    assert solvers.solve(g, 14, method="dtr").meta["peak_memory"] == 14


def test_dtr_not_monotone_returns_the_least_budget_run() -> None:
    """DTR gets stuck under 52 bytes on this graph but succeeds under 42: dtr(52)
    returns the run under 42 (a schedule that fits 52), so DTR's answer is feasible at
    every budget from its least one up."""
    g = random_dag(6, 10, regime="plain")
    assert dtr_min_budget(g) == 42 and _dtr_ops(g, 52) is None
    s = solvers.solve(g, 52, method="dtr")
    assert s.meta["run_budget"] == 42 and s.meta["peak_memory"] <= 42


def test_chen_sqrt_keeps_what_recomputation_needs() -> None:
    """Issue 11, item 12: f's only forward reader is g, x's only reader f; a backward
    node reads f. Dropping f after g would need x, freed after f: chen_sqrt used to raise
    the runner's internal error."""
    g = build_graph(
        [
            {"name": "x", "kind": "input", "cost": 0, "size": 4},
            {"name": "f", "cost": 1, "size": 3, "inputs": ["x"]},
            {"name": "g", "cost": 1, "size": 3, "inputs": ["f"]},
            {"name": "h", "cost": 1, "size": 3, "inputs": ["g"]},
            {"name": "bk", "kind": "backward", "cost": 1, "size": 1, "inputs": ["h", "f"]},
        ]
    )
    for method in ("chen_sqrt", "dtr", "store_all", "checkmate_milp", "checkmate_lp"):
        assert simulate(g, solvers.solve(g, 100, method=method)).peak_memory <= 100


REGIMES = ("plain", "zeros", "tmp")


@pytest.mark.parametrize("regime", REGIMES)
def test_min_budget_is_the_least_budget(regime: str) -> None:
    """Issue 11, item 12: every graph method that reports min_budget succeeds there and
    is Infeasible one byte below (random DAGs; zero sizes and costs; large tmp). DTR:
    also at every smaller budget; checkmate_lp never reports one."""
    for seed in range(8):
        g = random_dag(seed, 5 + seed % 4, regime=regime)
        for method in ("dtr", "chen_sqrt", "store_all", "checkmate_milp", "checkmate_lp"):
            try:
                solvers.solve(g, 0, method=method)
                least = 0
            except solvers.Infeasible as err:
                least = err.min_budget
            if method == "checkmate_lp":
                assert least is None
                continue
            assert least is not None, (method, seed)
            solvers.solve(g, least, method=method)
            if least > 0:
                with pytest.raises(solvers.Infeasible) as info:
                    solvers.solve(g, least - 1, method=method)
                assert info.value.min_budget == least
        least = dtr_min_budget(g)
        assert all(_dtr_ops(g, b) is None for b in range(least))


def test_presolve_infeasible_is_confirmed() -> None:
    """Issue 11, item 11: HiGHS's presolve calls this 7-node DAG infeasible at 24 bytes
    (and at 33-35 another one feasible at 32); a schedule at 24 exists."""
    g = random_dag(5, 7, regime="plain")
    s = solvers.solve(g, 24, method="checkmate_milp")
    assert s.meta["peak_memory"] <= 24 and s.meta["exact"] is True
    with pytest.raises(solvers.Infeasible) as info:
        solvers.solve(g, 23, method="checkmate_milp")
    assert info.value.min_budget == 24
    heard = []
    checkmate_milp(g, 24, progress=lambda fraction, message: heard.append(message))
    assert heard and all(isinstance(m, str) for m in heard)
    g = random_dag(57, 7, regime="plain")
    for budget in (32, 33, 34, 35):
        assert solvers.solve(g, budget, method="checkmate_milp").meta["peak_memory"] <= budget


def test_time_limit_bounds_are_not_min_budget() -> None:
    """Issue 11, item 11: under a time limit the least budget is not proven: min_budget
    is None, the bounds are attributes, and the call stays near its limit."""
    g = skip_graph(14, skip=2, seed=14)
    for budget in (10, 60):
        start = time.perf_counter()
        with pytest.raises(solvers.Infeasible) as info:
            solvers.solve(g, budget, method="checkmate_milp", time_limit=0.5)
        assert time.perf_counter() - start < 5  # about the limit; HiGHS may overrun a bit
        err = info.value
        assert err.min_budget is None and "time_limit=0.5s" in str(err)
        assert str(err).startswith(f"checkmate_milp: found no schedule under budget {budget}")
        lo, hi = err.least_budget_lower, err.least_budget_upper
        assert lo is None or hi is None or lo <= hi


def test_lp_cut_short_says_so(monkeypatch) -> None:
    """checkmate_lp whose LP was not solved in time: said in words (it printed 'the LP
    relaxation is time_limit at this budget'), and nothing proven."""
    import solvers.graph.checkmate_lp as lp
    from solvers.graph.checkmate_milp import Solved

    monkeypatch.setattr(lp, "solve_model", lambda *a, **k: Solved("time_limit", None, None,
                                                                   None, None, 0.01))  # fmt: skip
    with pytest.raises(solvers.Infeasible) as info:
        solvers.solve(GRAPHS["chain4"], 30, method="checkmate_lp", time_limit=0.01)
    assert info.value.min_budget is None
    assert "the LP relaxation was not solved within time_limit=0.01s" in str(info.value)


def test_time_limited_answers_say_so() -> None:
    g = skip_graph(14, skip=2, seed=14)
    top = simulate(g, store_all_graph_ops(g)).peak_memory
    s = solvers.solve(g, top, method="checkmate_milp", time_limit=30)
    assert s.meta["exact"] is True and "time_limited" not in s.meta
    s = checkmate_milp(g, 10**400)  # budgets beyond a float: capped, same answer
    assert simulate(g, s).makespan == pytest.approx(g.store_all_time())


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


def test_milp_rows_in_exact_units() -> None:
    """The MILP's memory rows are in units of the sizes' greatest common divisor: the
    same least budget in bytes at any scale; sizes beyond exact doubles are refused."""
    base = skip_graph(4, skip=2, seed=3)
    least = None
    for scale in (1, 4096, 10**18):
        g = Graph(tuple(dataclasses.replace(n, size=n.size * scale, tmp=n.tmp * scale)
                        for n in base.nodes))  # fmt: skip
        with pytest.raises(solvers.Infeasible) as info:
            checkmate_milp(g, 0)
        assert info.value.min_budget % scale == 0
        least = least or info.value.min_budget
        assert info.value.min_budget == least * scale
        assert simulate(g, checkmate_milp(g, least * scale)).peak_memory <= least * scale
    odd = Graph(tuple(dataclasses.replace(n, size=n.size * 10**18 + 1) for n in base.nodes))
    with pytest.raises(InvalidProblem, match="checkmate_milp.*2\\*\\*53"):
        checkmate_milp(odd, 10**30)
    assert simulate(odd, solvers.solve(odd, 10**22, method="dtr")).peak_memory <= 10**22
