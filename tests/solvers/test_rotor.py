"""The exact chain DP against independent oracles: exhaustive search (tests/brute_force.py),
a plain transcription of rotor's published recursion, and the simulator called on the
raw solver function's output (bypassing ``solvers.solve``, which checks its own)."""

from __future__ import annotations

import functools
import math
import random

import pytest
from brute_force import brute_force_optimum
from chain_strategies import REGIMES, chains, random_chain
from hypothesis import example, given, settings
from hypothesis import strategies as st

import schedir
import solvers
from schedir import Chain
from solvers.chain.rotor import build_table, min_memory, no_recompute_budget, rotor

# The issue's chains (items 8 and 9).
SMALL_ABAR = Chain.from_rotor([1], [1, 1], [0, 10], [0, 0], [100], [0, 0])
NOT_MONOTONE = Chain.from_rotor([2, 3, 3], [2, 2, 2, 1], [2, 2, 3, 4], [2, 4, 4, 6], [13, 2, 6],
                                [1, 0, 0, 1])  # fmt: skip
OPTIMISTIC = Chain.from_rotor([3, 3, 3, 1], [2, 1, 3, 2, 1], [6, 8, 1, 6, 8], [6, 11, 3, 8, 8],
                              [0, 10, 1, 0], [2, 2, 0, 1, 3])  # fmt: skip
CONSERVATIVE = Chain.from_rotor([5], [5, 5], [0, 2], [0, 2], [12], [3, 10])


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


def raw(chain: Chain, budget: int, **options) -> tuple[schedir.Schedule, schedir.Trace]:
    """The raw solver function's schedule and the simulator's trace of it."""
    schedule = rotor(chain, budget, **options)
    return schedule, schedir.simulate(chain, schedule)


def test_issue_chains_against_brute_force():
    # abar smaller than a: store-all needs 100, brute force 3.0; tight said 110
    schedule, trace = raw(SMALL_ABAR, 100)
    assert brute_force_optimum(SMALL_ABAR, 100) == trace.makespan == 3.0
    assert trace.peak_memory <= 100 and schedule.meta["exact"]
    with pytest.raises(solvers.Infeasible) as err:
        rotor(SMALL_ABAR, 99)
    assert err.value.min_budget == 100 and brute_force_optimum(SMALL_ABAR, 99) == math.inf
    # the default is monotone: 17.0 at 21 and at 22 (the published model gave 20.0 at 22)
    for budget in (21, 22):
        assert (
            raw(NOT_MONOTONE, budget)[1].makespan
            == 17.0
            == brute_force_optimum(NOT_MONOTONE, budget)
        )
    # the published model is wrong in both directions, fwd_tmp <= in_size + bwd_tmp or not
    assert all(OPTIMISTIC.fwd_tmp[k] <= OPTIMISTIC.in_size[k] + OPTIMISTIC.bwd_tmp[k]
               for k in range(OPTIMISTIC.length))  # fmt: skip
    assert published_reference(OPTIMISTIC, 35) == 28.0 < brute_force_optimum(OPTIMISTIC, 35)
    assert raw(OPTIMISTIC, 35)[1].makespan == 31.0 == brute_force_optimum(OPTIMISTIC, 35)
    published = rotor(OPTIMISTIC, 35, model="published")  # rotor's schedule does not fit
    assert published.meta["published_value"] == 28.0 and published.meta["model"] == "tight"
    assert published_reference(CONSERVATIVE, 14) == math.inf
    assert raw(CONSERVATIVE, 14)[1].makespan == 15.0 == brute_force_optimum(CONSERVATIVE, 14)


def check_tight_against_brute_force(regime: str, seed: int, count: int) -> int:
    """Every budget around [least, store-all] of ``count`` chains; the number checked."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(count):
        chain = random_chain(rng, rng.randint(1, 4), max_tmp=12, regime=regime)
        least, top = min_memory(chain), no_recompute_budget(chain)
        table = build_table(chain, top + 1)
        assert top == schedir.simulate(chain, solvers.store_all.store_all_ops(chain)).peak_memory
        for budget in range(max(0, least - 2), top + 2):
            expected = brute_force_optimum(chain, budget)
            assert table.value(budget) == pytest.approx(expected, rel=1e-12), (chain, budget)
            checked += 1
        assert brute_force_optimum(chain, least - 1) == math.inf
    return checked


@pytest.mark.parametrize("regime", REGIMES)
def test_tight_model_equals_brute_force_in_every_regime(regime):
    assert check_tight_against_brute_force(regime, REGIMES.index(regime), 7) > 20


@pytest.mark.slow
@pytest.mark.parametrize("regime", REGIMES)
def test_tight_model_equals_brute_force_on_many_chains(regime):
    assert check_tight_against_brute_force(regime, 100 + REGIMES.index(regime), 200) > 1000


@settings(max_examples=60, deadline=None)
@given(chains(max_length=7), st.integers(0, 10**6))
def test_table_equals_plain_published_recursion(chain, seed):
    top = no_recompute_budget(chain, tight=False) + 2
    table = build_table(chain, top, tight=False)
    budgets = random.Random(seed).sample(range(1, top + 1), k=min(12, top))
    for budget in budgets:
        assert table.value(budget) == pytest.approx(published_reference(chain, budget), rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(chains(), st.sampled_from(["published", "tight"]), st.floats(0, 1.2))
def test_raw_schedules_fit_and_take_the_dp_value(chain, model, fraction):
    least = min_memory(chain, tight=model == "tight")
    budget = least + int(fraction * (no_recompute_budget(chain) - least))
    try:
        schedule, trace = raw(chain, budget, model=model)
    except solvers.Infeasible as err:
        # published only: its schedule does not fit (no least budget), or the budget is
        # below its own least (fraction 1 of a smaller store-all budget)
        assert model == "published"
        assert err.min_budget is None or budget < err.min_budget
        return
    assert trace.peak_memory <= budget
    assert trace.makespan == pytest.approx(schedule.meta["dp_value"], rel=1e-9)
    if schedule.meta["model"] == model == "published":
        assert schedule.meta["dp_value"] == pytest.approx(published_reference(chain, budget))


@settings(max_examples=60, deadline=None)
@given(chains(max_length=4, max_size=8, max_tmp=10))
def test_min_budget_is_the_least_feasible_budget(chain):
    least = min_memory(chain)
    assert math.isfinite(brute_force_optimum(chain, least))
    assert brute_force_optimum(chain, least - 1) == math.inf
    assert raw(chain, least)[1].peak_memory <= least
    if least > 0:
        with pytest.raises(solvers.Infeasible) as err:
            rotor(chain, least - 1)
        assert err.value.min_budget == least and str(least) in str(err.value)


@settings(max_examples=30, deadline=None)
@given(chains())
@example(NOT_MONOTONE)
@example(SMALL_ABAR)
def test_default_rotor_is_monotone_in_the_budget(chain):
    least, top = min_memory(chain), no_recompute_budget(chain)
    step = max(1, (top + 2 - least) // 40)
    values = [raw(chain, b)[1].makespan for b in range(least, top + 2, step)]
    values.append(raw(chain, top)[1].makespan)
    # equal optima may be sums of the same times in another order: 1 ulp apart
    assert all(a >= b * (1 - 1e-12) for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == pytest.approx(chain.store_all_time())


def scaled(chain: Chain, scale: int, rng: random.Random) -> Chain:
    """The chain with every size times ``scale`` plus a little noise (gcd 1)."""
    sizes = {f: tuple(v * scale + rng.randint(0, 99) for v in getattr(chain, f))
             for f in ("in_size", "saved_size", "fwd_tmp", "bwd_tmp")}  # fmt: skip
    return Chain(chain.fwd_time, chain.bwd_time, **sizes)


def test_discretized_answers_fit_and_bound_the_byte_optimum():
    rng = random.Random(3)
    fallbacks = 0
    for _ in range(12):
        chain = scaled(random_chain(rng, rng.randint(2, 4), max_size=9), 1_000, rng)
        least, top = min_memory(chain), no_recompute_budget(chain)
        for budget in sorted({least, least + (top - least) // 3, top - 1} - {least - 1, top}):
            schedule, trace = raw(chain, budget, max_slots=64, slots=16)
            meta = schedule.meta
            optimum = brute_force_optimum(chain, budget)
            assert trace.peak_memory <= budget and meta["exact"] is False
            assert meta["lower_bound"] <= optimum + 1e-9 <= trace.makespan + 2e-9
            info = meta["discretization"]
            assert info["lower_bound"] == meta["lower_bound"] and info["makespan"] == trace.makespan
            assert info["relative_loss"] == pytest.approx(
                (trace.makespan - meta["lower_bound"]) / meta["lower_bound"]
            )
            fallbacks += "fallback" in meta
    assert fallbacks > 0  # at the least budget, rounding up always loses it


def test_sizes_with_a_common_unit_are_solved_exactly():
    # item 10: sizes multiples of 1e6 at the least budget: exact in units of the gcd
    rng = random.Random(10)
    small = random_chain(rng, 17, max_size=40, regime="usual")
    chain = Chain(small.fwd_time, small.bwd_time,
                  **{f: tuple(v * 1_000_000 for v in getattr(small, f))
                     for f in ("in_size", "saved_size", "fwd_tmp", "bwd_tmp")})  # fmt: skip
    for units in (min_memory(small), (min_memory(small) + no_recompute_budget(small)) // 2):
        schedule, trace = raw(chain, units * 1_000_000 + 999_999)
        assert schedule.meta["exact"] and schedule.meta["size_unit"] == 1_000_000
        assert "fallback" not in schedule.meta
        assert trace.makespan == pytest.approx(build_table(small, units).value(units))
    tiny = scaled(random_chain(rng, 3, regime="usual"), 1_000_000, random.Random(0))
    budget = min_memory(tiny)
    assert raw(tiny, budget)[1].makespan == pytest.approx(brute_force_optimum(tiny, budget))


def test_memory_cap_coarsens_the_table_or_refuses():
    chain = scaled(random_chain(random.Random(4), 6, regime="usual"), 1_000, random.Random(1))
    budget = (min_memory(chain) + no_recompute_budget(chain)) // 2
    cap = solvers.chain.rotor.table_bytes(chain, 100)  # a table of 100 slots
    schedule, trace = raw(chain, budget, memory_cap=cap)
    info = schedule.meta["discretization"]
    assert info["slots"] <= 100 and info["limited_by"] == "memory_cap"
    assert schedule.meta["memory_cap"] == cap and trace.peak_memory <= budget
    with pytest.raises(solvers.MemoryLimit, match=r"bytes per memory slot.*memory_cap = 1000"):
        rotor(chain, budget, memory_cap=1000)
    assert rotor(chain, budget).meta["memory_cap"] == solvers.chain.rotor.default_memory_cap()


def test_huge_budgets_are_exact_integers():
    chain = schedir.load("examples/chain_small.json")
    schedule = solvers.solve(chain, 10**30, "rotor")
    assert schedule.meta["budget"] == 10**30 and schedule.meta["exact"]
    assert schedule.meta["makespan"] == chain.store_all_time()
    for bad in (1e300, 2.0**60, 1.5, float("inf")):
        with pytest.raises(schedir.InvalidProblem, match="budget"):
            solvers.solve(chain, bad, "rotor")
    assert solvers.solve(chain, 2000.0, "rotor").meta["budget"] == 2000


def test_progress_reaches_a_callable():
    chain = random_chain(random.Random(6), 30, regime="usual")
    calls = []
    solvers.solve(chain, no_recompute_budget(chain) - 1, "rotor",
                  progress=lambda f, m: calls.append((f, m)))  # fmt: skip
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0 < fractions[0]
    assert all("DP table" in m for _, m in calls)


def test_progress_true_prints_only_for_long_solves(capsys):
    from solvers.registry import _StderrProgress

    chain = schedir.load("examples/chain_small.json")
    solvers.solve(chain, 1400, "rotor", progress=True)
    solvers.solve(chain, 1400, "chen_sqrt", progress=True)
    assert capsys.readouterr().err == ""
    report = _StderrProgress("rotor", delay=0.0, every=0.0)
    report(0.25, "DP table")
    report.done()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("rotor:  25% DP table (") and err[1].startswith("rotor: done in")
    with pytest.raises(TypeError, match="progress"):
        solvers.solve(chain, 1400, "rotor", progress="yes")


def test_progress_true_speaks_through_silent_stretches(capsys, monkeypatch):
    """A solver that takes ``progress`` may still be silent for long (revolve building a
    2-million-op schedule at L = 2000), and the simulator then checks the answer: both
    get lines (here after 0.1 s instead of 2 s)."""
    import time

    from solvers import registry

    eager = functools.partial(registry._StderrProgress, delay=0.1, every=0.0)
    monkeypatch.setattr(registry, "_StderrProgress", eager)
    monkeypatch.setattr(registry, "simulate", lambda *a: time.sleep(0.7) or schedir.simulate(*a))

    def silent(chain, budget, *, progress=None):
        time.sleep(0.7)  # takes progress, never calls it
        return schedir.Schedule(solvers.chain.store_all.store_all_ops(chain))

    solvers.register("silent", problem=Chain, exact=False, description="test")(silent)
    try:
        chain = schedir.load("examples/chain_small.json")
        solvers.solve(chain, 2000, "silent", progress=True)
    finally:
        solvers.unregister("silent", Chain)
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("silent: running (") for line in err), err
    assert any(line.startswith("silent: checking the answer") for line in err), err
    assert err[-1].startswith("silent: done in")


def test_tradeoff_is_exact_where_solve_is_and_bounds_the_rest():
    chain = random_chain(random.Random(5), 10, max_size=30, regime="usual")
    budgets = list(range(min_memory(chain) - 5, no_recompute_budget(chain) + 5, 7))
    curve = solvers.tradeoff(chain, budgets)
    assert all(curve.exact) and curve.lower_bounds == curve.makespans
    for budget, value in zip(curve.budgets, curve.makespans, strict=True):
        try:
            expected = raw(chain, budget)[1].makespan
        except solvers.Infeasible:
            expected = math.inf
        assert value == pytest.approx(expected)
    big = scaled(random_chain(random.Random(7), 4, max_size=9, regime="usual"), 1000,
                 random.Random(2))  # fmt: skip
    least, top = min_memory(big), no_recompute_budget(big)
    budgets = [least - 1, least, (least + top) // 2, top - 1, top]
    curve = solvers.tradeoff(big, budgets, max_slots=64, slots=16)
    assert curve.exact[0] and curve.makespans[0] == math.inf and curve.exact[-1]
    for budget, value, exact, bound in zip(budgets, curve.makespans, curve.exact,
                                           curve.lower_bounds, strict=True):  # fmt: skip
        optimum = brute_force_optimum(big, budget)
        assert bound <= optimum + 1e-9 <= value + 2e-9
        assert exact == (value == optimum) or not exact
        if not exact:
            assert curve.slot_size is not None or value == raw(big, budget)[1].makespan
