"""Offloading: simulator rules, rotor_offload DP, offload_milp cross-check, greedy, errors."""

from __future__ import annotations

import math
import random

import chain_strategies as strategies
import pytest

import schedir
import solvers
from schedir import (
    B,
    Chain,
    F_all,
    InvalidProblem,
    InvalidSchedule,
    Loss,
    Offload,
    OffloadProblem,
    OffloadSchedule,
    Platform,
    Prefetch,
    Wait,
    simulate_chain,
    simulate_offload,
)
from solvers.chain.rotor import build_table as rotor_table
from solvers.chain.store_all import store_all_ops
from solvers.offload.offload_milp import solve_milp
from solvers.offload.rotor_offload import Model, build_table, working_set


def random_chain(L: int, rng: random.Random) -> Chain:
    fw = [float(rng.randint(1, 5)) for _ in range(L)]
    bw = [float(rng.randint(1, 8)) for _ in range(L + 1)]
    cw = [rng.randint(1, 6) for _ in range(L + 1)]
    cbw = [0] + [cw[k + 1] + rng.randint(0, 6) for k in range(L)]
    ft = [rng.randint(0, 3) for _ in range(L)]
    bt = [rng.randint(0, 3) for _ in range(L + 1)]
    return Chain.from_rotor(fw, bw, cw, cbw, ft, bt)


def chains(n: int, seed: int, max_len: int = 5):
    rng = random.Random(seed)
    return [random_chain(rng.randint(1, max_len), rng) for _ in range(n)]


def test_no_copy_ops_equals_chain_simulator():
    for chain in chains(20, 0):
        for ops in (store_all_ops(chain), solvers.solve(chain, 10**6, "recompute_all").ops):
            ref = simulate_chain(chain, ops)
            got = simulate_offload(OffloadProblem(chain, Platform.host_offload(1.0)), ops)
            assert got.makespan == ref.makespan
            assert got.peak_memory == ref.peak_memory == got.program_peak
            assert got.resident == ref.resident and got.op_peak == ref.op_peak


def test_copy_timing_and_memory_rules():
    c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    p = OffloadProblem(c, Platform.host_offload(2.0))  # 4 bytes take 2 s
    ops = [Offload("a[0]"), F_all(0), Wait("a[0]"), Prefetch("a[0]"), Loss(), Wait("a[0]"), B(0)]
    t = simulate_offload(p, ops)
    assert t.stream == ("offload", "compute", "wait", "prefetch", "compute", "wait", "compute")
    assert (t.start[0], t.end[0]) == (0.0, 2.0)  # offload overlaps F_all(0) (1 s), then waits
    assert t.end[2] == 2.0 and t.end[5] == 4.0 and t.makespan == 6.0
    assert t.resident == (4, 16, 12, 16, 24, 24, 4)  # a[0] leaves at its Wait, back at Prefetch
    assert t.host_peak == 4 and t.host_resident[2] == 4 and t.host_resident[-1] == 0
    assert t.peak_memory == t.program_peak == 28
    # the copy ends before the Wait: the timed curve frees a[0] at t = 2, not later
    assert any(time == 2.0 and level == 12 for time, level in t.device_curve)


@pytest.mark.parametrize(
    "ops, message",
    [
        ([Prefetch("d[1]")], "not on the host"),
        ([Offload("a[0]"), Wait("a[0]"), F_all(0)], "on the host: Prefetch it first"),
        ([Wait("a[0]")], "no copy"),
        ([Offload("a[0]"), Offload("a[0]")], "already being offloaded"),
        ([Offload("d[0]")], "not resident"),
        ([F_all(0), Loss()], "incomplete training step"),
    ],
)
def test_invalid_schedules(ops, message):
    c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    with pytest.raises(InvalidSchedule, match=message):
        simulate_offload(OffloadProblem(c, Platform.host_offload(2.0)), ops)


def test_bad_input_errors():
    with pytest.raises(InvalidProblem, match="bandwidth"):
        Platform.host_offload(-1.0)
    c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    small_host = OffloadProblem(c, Platform.host_offload(2.0, host_memory=2))
    ops = [Offload("a[0]"), F_all(0), Wait("a[0]"), Prefetch("a[0]"), Loss(), Wait("a[0]"), B(0)]
    with pytest.raises(InvalidSchedule, match="host memory exceeded"):
        simulate_offload(small_host, ops)
    with pytest.raises(InvalidProblem, match="device_memory"):
        solvers.solve(OffloadProblem(c, Platform.host_offload(1.0, device_memory=10)), 20,
                      "rotor_offload")  # fmt: skip
    with pytest.raises(InvalidProblem, match="weight_size"):
        OffloadProblem(c, Platform(), weight_size=(1,))


def test_host_too_small_falls_back_to_rotor_or_raises():
    for chain in chains(30, 3, 5):  # a chain and budget where only offloading fits
        table = build_table(OffloadProblem(chain, Platform.host_offload(math.inf)))
        budget = table.min_budget()
        if rotor_table(chain, budget, tight=True).value(budget) == math.inf:
            break
    else:
        pytest.fail("no chain where offloading lowers the least budget")
    problem = OffloadProblem(chain, Platform.host_offload(math.inf, host_memory=0))
    with pytest.raises(solvers.Infeasible, match="host memory"):
        solvers.solve(problem, budget, "rotor_offload")
    top = simulate_chain(chain, store_all_ops(chain)).peak_memory
    s = solvers.solve(problem, top, "rotor_offload")
    assert s.meta["makespan"] == pytest.approx(chain.store_all_time())


def regime_chains(n: int, seed: int, max_len: int = 4):
    """Chains of every regime of tests/chain_strategies.py (abar smaller than a, zeros,
    large temporaries, a loss with its own fields) besides the usual one."""
    rng = random.Random(seed)
    return [strategies.random_chain(rng, rng.randint(1, max_len), regime=regime)
            for regime in strategies.REGIMES for _ in range(n)]  # fmt: skip


def test_dp_zero_bandwidth_is_rotor_and_never_worse_and_simulates_exactly():
    for chain in chains(15, 1) + regime_chains(3, 1):
        top = sum(chain.in_size) + sum(chain.saved_size) + 12
        rt = rotor_table(chain, top, tight=True)
        for bw in (0.0, 1.5, math.inf):
            problem = OffloadProblem(chain, Platform.host_offload(bw))
            table = build_table(problem)
            for budget in range(chain.in_size[0], top):
                value, ref = table.value(budget), rt.value(budget)
                assert value <= ref + 1e-9
                if bw == 0.0:
                    assert value == pytest.approx(ref, abs=1e-9) or value == ref
                if math.isfinite(value):
                    trace = simulate_offload(problem, table.ops(budget))
                    assert trace.makespan == pytest.approx(value, abs=1e-9)
                    assert trace.peak_memory <= trace.program_peak <= budget


def test_infinite_bandwidth_reaches_store_all_at_the_working_set():
    for chain in chains(15, 2, 6):
        problem = OffloadProblem(chain, Platform.host_offload(math.inf))
        ws = working_set(problem)
        s = solvers.solve(problem, ws, "rotor_offload")
        assert s.meta["makespan"] == pytest.approx(chain.store_all_time())
        assert s.meta["peak_memory"] <= ws


def test_dp_equals_milp_on_small_chains():
    rng = random.Random(7)
    checked = 0
    for chain in chains(2, 5) + regime_chains(1, 6, max_len=2)[1:3]:
        problem = OffloadProblem(chain, Platform.host_offload(rng.choice([1.0, 3.0])))
        table = build_table(problem)
        least = table.min_budget()
        for budget in (least - 1, least + 2, least + 6):
            memory = budget - chain.in_size[0]
            milp = solve_milp(Model.of(problem), memory)[0] if memory >= 0 else math.inf
            assert table.value(budget) == pytest.approx(milp, abs=1e-6) or milp == math.inf
            checked += 1
    five = random_chain(5, random.Random(11))
    problem = OffloadProblem(five, Platform.host_offload(2.0))
    budget = build_table(problem).min_budget() + 4
    dp = solvers.solve(problem, budget, "rotor_offload")
    milp = solvers.solve(problem, budget, "offload_milp")
    assert dp.meta["makespan"] == pytest.approx(milp.meta["makespan"], abs=1e-6)
    assert dp.meta["exact"] and milp.meta["exact"] and milp.meta["milp_status"] == "optimal"
    assert checked == 12


def test_greedy_valid_between_dp_and_rotor():
    for chain in chains(12, 4, 6):
        problem = OffloadProblem(chain, Platform.host_offload(2.0))
        table = build_table(problem)
        rt = rotor_table(chain, sum(chain.in_size) + sum(chain.saved_size), tight=True)
        for budget in range(table.min_budget(), table.min_budget() + 15, 3):
            if not math.isfinite(rt.value(budget)):
                continue
            s = solvers.solve(problem, budget, "offload_greedy")
            assert table.value(budget) - 1e-9 <= s.meta["makespan"] <= rt.value(budget) + 1e-9


def test_json_round_trip_and_registry():
    chain = chains(1, 9, 4)[0]
    problem = OffloadProblem(chain, Platform.host_offload("pcie4", host_memory=10**9))
    again = schedir.from_dict(problem.to_dict())
    assert again == problem
    s = solvers.solve(problem, build_table(problem).min_budget() + 3, "rotor_offload")
    assert isinstance(s, OffloadSchedule)
    assert schedir.from_dict(s.to_dict()) == s
    names = {m.name for m in solvers.available(OffloadProblem)}
    assert {"rotor_offload", "offload_milp", "offload_greedy"} <= names


@pytest.mark.slow
def test_dp_equals_milp_many_chains():
    rng = random.Random(21)
    for chain in chains(20, 13):
        problem = OffloadProblem(chain, Platform.host_offload(rng.choice([0.5, 1.0, 3.0])))
        table = build_table(problem)
        least = table.min_budget()
        for budget in (least, least + 3, least + 9):
            milp = solve_milp(Model.of(problem), budget - chain.in_size[0])[0]
            assert table.value(budget) == pytest.approx(milp, abs=1e-6)


OFFLOAD_METHODS = ["rotor_offload", "offload_greedy", "offload_milp"]


def raw(method: str):
    """The registered function itself, bypassing ``solvers.solve``'s checks."""
    return solvers.get(method, OffloadProblem).function


def least_and_check(problem: OffloadProblem, method: str, **options) -> int:
    """The method's min_budget, checked: feasible there (simulated), Infeasible below."""
    try:
        raw(method)(problem, 0, **options)
        return 0
    except solvers.Infeasible as err:
        least = err.min_budget
    assert least is not None, method
    schedule = raw(method)(problem, least, **options)
    trace = simulate_offload(problem, schedule)
    assert trace.peak_memory <= trace.program_peak <= least, method
    with pytest.raises(solvers.Infeasible) as err:
        raw(method)(problem, least - 1, **options)
    assert err.value.min_budget == least, method
    return least


@pytest.mark.parametrize("method", OFFLOAD_METHODS)
def test_min_budget_is_the_least_feasible_budget(method):
    rng = random.Random(OFFLOAD_METHODS.index(method))
    count, length = (2, 3) if method == "offload_milp" else (4, 4)
    pool = chains(count, 30 + OFFLOAD_METHODS.index(method), length)
    pool += regime_chains(1, 40, max_len=3)
    for chain in pool:
        chain = scaled(chain, rng.choice([1, 997]))
        for bandwidth in (0.0, 2.0, math.inf):
            problem = OffloadProblem(chain, Platform.host_offload(bandwidth * 997))
            if method == "offload_milp" and chain.in_size[0] > 100:
                continue  # the MILP is exact in bytes: small sizes only
            options = {} if method == "offload_milp" else {"max_units": 300, "slots": 40}
            least = least_and_check(problem, method, **options)
            if method == "rotor_offload" and bandwidth == 0.0:  # rotor's moves only
                assert least == solvers.chain.rotor.min_memory(chain)


def scaled(chain: Chain, factor: int) -> Chain:
    sizes = ("in_size", "saved_size", "fwd_tmp", "bwd_tmp")
    return Chain(chain.fwd_time, chain.bwd_time,
                 **{f: tuple(v * factor + (k % 3) * (factor > 1) for k, v in
                             enumerate(getattr(chain, f))) for f in sizes})  # fmt: skip


def test_abar_smaller_than_a_is_handled_like_rotor():
    # the chain: store-all peaks at 100, rotor_offload at bandwidth 0 finds 3.0
    chain = Chain.from_rotor([1], [1, 1], [0, 10], [0, 0], [100], [0, 0])
    for bandwidth in (0.0, 1.0):
        problem = OffloadProblem(chain, Platform.host_offload(bandwidth))
        schedule = raw("rotor_offload")(problem, 100)
        assert simulate_offload(problem, schedule).makespan == 3.0
        assert least_and_check(problem, "rotor_offload") == 100


def test_weight_offload_min_budget_is_the_least_feasible_budget():
    rng = random.Random(8)
    for _ in range(6):
        chain = strategies.random_chain(rng, rng.randint(1, 3), regime="usual")
        weights = [rng.randint(0, 12) for _ in range(chain.length)] + [rng.choice([0, 3])]
        problem = OffloadProblem(chain, Platform.host_offload(4.0), weight_size=weights)
        for compute in ("store_all", "rotor"):
            try:
                raw("weight_offload")(problem, 0, compute=compute, algorithm="greedy")
                continue
            except solvers.Infeasible as err:
                least = err.min_budget
            s = raw("weight_offload")(problem, least, compute=compute, algorithm="greedy")
            assert simulate_offload(problem, s).program_peak <= least
            with pytest.raises(solvers.Infeasible):
                raw("weight_offload")(problem, least - 1, compute=compute, algorithm="greedy")


def test_exactness_and_huge_budgets():
    chain = chains(1, 9, 4)[0]
    problem = OffloadProblem(chain, Platform.host_offload(2.0))
    for method in OFFLOAD_METHODS:
        s = solvers.solve(problem, 10**30, method)
        assert s.meta["budget"] == 10**30 and s.meta["makespan"] == chain.store_all_time()
        assert s.meta["exact"] is (method != "offload_greedy")
    big = scaled(chain, 10**6 + 3)  # sizes without a common unit: rounded, not exact
    s = raw("rotor_offload")(OffloadProblem(big, Platform.host_offload(2e6)), 10**30)
    assert s.meta["exact"] is False or s.meta.get("fallback") == "rotor"
    with pytest.raises(InvalidProblem, match="bandwidth = 1e-306: outside"):
        OffloadProblem(chain, Platform.host_offload(1e-306))


@pytest.mark.parametrize("method", ["rotor_offload", "offload_greedy"])
def test_table_builds_report_progress(method):
    problem = OffloadProblem(chains(1, 12, 5)[0], Platform.host_offload(2.0))
    calls = []
    raw(method)(problem, 10**6, progress=lambda f, m: calls.append(f))
    assert calls == sorted(calls) and calls[-1] == 1.0
