"""The exact chain DP: against brute force, against a plain reference of rotor's recursion,
and against the simulator."""

from __future__ import annotations

import functools
import math
import random

import pytest
from brute_force import brute_force_optimum
from chain_strategies import chains, random_chain
from hypothesis import given, settings
from hypothesis import strategies as st

import schedir
import solvers
from solvers.rotor import build_table, min_memory, no_recompute_budget


def published_reference(chain: schedir.Chain, budget: int) -> float:
    """Rotor's published recursion (docs/chain_solvers.md), written as plainly as possible."""
    L = chain.length
    x = list(chain.in_size) + [0]
    s, fw, bw = chain.saved_size, chain.fwd_time, chain.bwd_time
    ft, bt = chain.fwd_tmp, chain.bwd_tmp

    @functools.cache
    def C(m: int, i: int, t: int) -> float:
        if m < 0:
            return math.inf
        if i == t:
            need = max(x[i + 1] + s[i] + ft[i], x[i] + x[i + 1] + s[i] + bt[i])
            return fw[i] + bw[i] if m >= need else math.inf
        if m < x[t + 1] + x[i + 1] + ft[i]:
            return math.inf
        if t > i + 1 and m < x[t + 1] + max(x[j] + x[j + 1] + ft[j] for j in range(i + 1, t)):
            return math.inf
        best = math.inf
        if m >= s[i]:
            best = C(m, i, i) + C(m - s[i], i + 1, t)
        for j in range(i + 1, t + 1):
            if m >= x[j]:
                best = min(best, sum(fw[i:j]) + C(m - x[j], j, t) + C(m, i, j - 1))
        return best

    return C(budget - x[0], 0, L)


def test_tight_model_equals_brute_force_on_small_chains():
    rng = random.Random(11)
    checked = 0
    for _ in range(25):
        chain = random_chain(rng, rng.randint(1, 4), max_tmp=12)
        least, top = min_memory(chain, tight=True), no_recompute_budget(chain, tight=True)
        table = build_table(chain, top + 1, tight=True)
        for budget in range(max(1, least - 2), top + 2):
            expected = brute_force_optimum(chain, budget)
            assert table.value(budget) == pytest.approx(expected, rel=1e-12), (chain, budget)
            checked += 1
    assert checked > 150


def test_published_model_equals_brute_force_when_forward_temps_are_small():
    # With fwd_tmp <= in_size + bwd_tmp, rotor's base case charges nothing spurious.
    rng = random.Random(12)
    for _ in range(15):
        chain = random_chain(rng, rng.randint(1, 4))
        if any(chain.fwd_tmp[k] > chain.in_size[k] + chain.bwd_tmp[k] for k in range(chain.length)):
            continue
        table = build_table(chain, no_recompute_budget(chain) + 1)
        for budget in range(max(1, min_memory(chain) - 2), no_recompute_budget(chain) + 2):
            assert table.value(budget) == pytest.approx(brute_force_optimum(chain, budget))


@settings(max_examples=60, deadline=None)
@given(chains(max_length=7), st.integers(0, 10**6))
def test_table_equals_plain_published_recursion(chain, seed):
    top = no_recompute_budget(chain) + 2
    table = build_table(chain, top)
    budgets = random.Random(seed).sample(range(1, top + 1), k=min(12, top))
    for budget in budgets:
        assert table.value(budget) == pytest.approx(published_reference(chain, budget), rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(chains(), st.sampled_from(["published", "tight"]), st.floats(0, 1.2))
def test_rotor_schedules_are_valid_and_match_dp_value(chain, model, fraction):
    least = min_memory(chain, tight=model == "tight")
    budget = least + int(fraction * (no_recompute_budget(chain) - least))
    schedule = solvers.solve(chain, budget, "rotor", model=model)
    trace = schedir.simulate(chain, schedule)
    assert trace.peak_memory <= budget
    assert trace.makespan == pytest.approx(schedule.meta["dp_value"], rel=1e-9)
    if schedule.meta["model"] == model == "published":
        assert schedule.meta["dp_value"] == pytest.approx(published_reference(chain, budget))


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([False, True]))
def test_infeasible_exactly_below_min_memory(chain, tight):
    model = "tight" if tight else "published"
    least = min_memory(chain, tight=tight)
    table = build_table(chain, least)
    assert math.isfinite(table.value(least)) or tight
    if least > 1:
        with pytest.raises(solvers.Infeasible) as err:
            solvers.solve(chain, least - 1, "rotor", model=model)
        assert err.value.min_budget == least
        assert str(least) in str(err.value)


@settings(max_examples=60, deadline=None)
@given(chains())
def test_values_are_monotone_in_budget(chain):
    for tight in (False, True):
        top = no_recompute_budget(chain, tight=tight)
        table = build_table(chain, top, tight=tight)
        values = [table.value(b) for b in range(top + 1)]
        assert all(a >= b for a, b in zip(values, values[1:], strict=False))
        assert values[-1] == pytest.approx(chain.store_all_time())


def test_discretized_solve_is_feasible_in_bytes_and_reports_its_loss():
    rng = random.Random(3)
    for _ in range(5):
        small = random_chain(rng, 12, max_size=50)
        scale = 1_000_003  # bytes: far above max_slots
        chain = schedir.Chain(
            small.fwd_time,
            small.bwd_time,
            *(
                tuple(v * scale + rng.randint(0, 999) for v in getattr(small, f))
                for f in ("in_size", "saved_size", "fwd_tmp", "bwd_tmp")
            ),
        )
        least = min_memory(chain, tight=True)
        budget = (least + no_recompute_budget(chain, tight=True)) // 2
        schedule = solvers.solve(chain, budget, "rotor", slots=200)
        info = schedule.meta["discretization"]
        trace = schedir.simulate(chain, schedule)
        assert trace.peak_memory <= budget
        assert info["lower_bound"] <= trace.makespan + 1e-9
        assert info["slot_size"] == -(-min(budget, no_recompute_budget(chain)) // info["slots"])
        assert schedule.meta["exact"] is False


def test_exact_below_max_slots():
    chain = schedir.load("examples/chain_small.json")
    schedule = solvers.solve(chain, 1400, "rotor")
    assert schedule.meta["exact"] is True
    assert schedule.meta["dp_value"] == pytest.approx(published_reference(chain, 1400))


def test_tradeoff_matches_budget_by_budget_solves():
    chain = random_chain(random.Random(5), 10, max_size=30)
    budgets = list(range(min_memory(chain) - 5, no_recompute_budget(chain) + 5, 7))
    curve = solvers.tradeoff(chain, budgets)
    for budget, value in zip(curve.budgets, curve.makespans, strict=True):
        try:
            expected = solvers.solve(chain, budget, "rotor").meta["dp_value"]
        except solvers.Infeasible:
            expected = math.inf
        assert value == pytest.approx(expected)
