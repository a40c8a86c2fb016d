"""Every chain method against independent oracles: exhaustive search for the optimum, the
simulator called on each raw solver function's output (not through ``solvers.solve``,
which checks its own), and plain reference versions of chen_sqrt and revolve."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from brute_force import brute_force_optimum
from chain_strategies import REGIMES, chains, homogeneous_chain, random_chain
from hypothesis import given, settings

import schedir
import solvers
from schedir import F_ck, F_n
from solvers.chain._tree import Record, Split, TreeCost, tree_ops
from solvers.chain.chen_sqrt import chen_cost, chen_ops
from solvers.chain.revolve import first_split, griewank_advances, loss_lower_bounds, revolve_ops
from solvers.chain.rotor import min_memory, no_recompute_budget

CHAIN_METHODS = ["rotor", "store_all", "recompute_all", "chen_sqrt", "revolve"]


def raw(method: str):
    """The registered function itself, bypassing ``solvers.solve``'s checks."""
    return solvers.get(method, schedir.Chain).function


def test_registry_lists_chain_methods_with_descriptions():
    methods = {m.name: m for m in solvers.available(schedir.Chain)}
    assert set(CHAIN_METHODS) <= set(methods)
    assert methods["rotor"].exact and not methods["revolve"].exact
    assert all(m.description for m in methods.values())
    assert methods["rotor"].reports_progress and not methods["store_all"].reports_progress


def test_unknown_method_lists_known_ones():
    chain = schedir.load("examples/chain_small.json")
    with pytest.raises(ValueError, match="unknown solver 'nope'.*rotor"):
        solvers.solve(chain, 2000, method="nope")


@pytest.mark.parametrize("budget", [-1, 1.5, float("nan"), "1 parsec", "50%", True, 1e300,
                                    2.0**53 + 2])  # fmt: skip
def test_bad_budget_is_rejected(budget):
    chain = schedir.load("examples/chain_small.json")
    with pytest.raises(schedir.InvalidProblem, match="budget") as err:
        solvers.solve(chain, budget)
    assert repr(budget) in str(err.value)


def test_budgets_in_units():  # schedir.budget, the one parser
    chain = schedir.load("examples/chain_small.json")
    assert solvers.solve(chain, "2KiB").ops == solvers.solve(chain, 2048).ops


@pytest.mark.parametrize("method", CHAIN_METHODS)
def test_every_method_handles_huge_integer_budgets(method):
    chain = schedir.load("examples/chain_small.json")
    schedule = solvers.solve(chain, 10**30, method)
    assert schedule.meta["budget"] == 10**30 and "exact" in schedule.meta


def test_infeasible_message_has_no_empty_clause():
    # without a least budget nothing is proven: the method found no schedule
    err = solvers.Infeasible("m", 5, None)
    assert str(err) == "m: found no schedule under budget 5"
    err = solvers.Infeasible("m", 5, 9, "why")
    assert str(err) == "m: no schedule fits budget 5; the minimum feasible budget is 9 (why)"
    assert (
        str(solvers.Infeasible("m", 5, None, "why")) == "m: found no schedule under budget 5 (why)"
    )
    assert str(solvers.Infeasible("m", None, None, "why")) == "m: found no schedule (why)"


def test_every_method_fits_and_rotor_is_the_brute_force_optimum():
    rng = random.Random(1)
    for regime in REGIMES:
        for _ in range(3):
            chain = random_chain(rng, rng.randint(1, 4), max_tmp=10, regime=regime)
            least, top = min_memory(chain), no_recompute_budget(chain)
            for budget in {least, (least + top) // 2, top}:
                optimum = brute_force_optimum(chain, budget)
                for method in CHAIN_METHODS:
                    try:
                        schedule = raw(method)(chain, budget)
                    except solvers.Infeasible as err:
                        assert err.min_budget > budget, method
                        continue
                    trace = schedir.simulate(chain, schedule)
                    assert trace.peak_memory <= budget, (method, chain, budget)
                    assert optimum <= trace.makespan * (1 + 1e-9) + 1e-12, (method, chain)
                    if method == "rotor":
                        assert trace.makespan == pytest.approx(optimum, rel=1e-12)
                    assert schedule.meta["exact"] is (method == "rotor")


@settings(max_examples=40, deadline=None)
@given(chains(max_length=7))
def test_min_budget_is_exactly_the_least_feasible_budget(chain):
    for method in CHAIN_METHODS:
        try:
            raw(method)(chain, 0)
            continue  # feasible at 0: nothing below
        except solvers.Infeasible as err:
            least = err.min_budget
        schedule = raw(method)(chain, least)
        assert schedir.simulate(chain, schedule).peak_memory <= least, method
        with pytest.raises(solvers.Infeasible) as err:
            raw(method)(chain, least - 1)
        assert err.value.min_budget == least, method


def plain_advances(steps: int, checkpoints: int):
    """A(l, c) of the recursion (revolve's module doc) and its first minimizer, plainly."""
    A = np.full((steps + 1, checkpoints + 1), np.inf)
    first = np.zeros((steps + 1, checkpoints + 1), dtype=np.int64)
    A[1, :] = 0
    for c in range(1, checkpoints + 1):
        for l in range(2, steps + 1):
            cost = [j + A[l - j, c - 1] + A[j, c] for j in range(1, l)]
            first[l, c] = int(np.argmin(cost)) + 1
            A[l, c] = min(cost)
    return A, first


def test_revolve_split_is_the_recursions_first_minimizer():
    A, first = plain_advances(60, 60)
    for l in range(2, 61):
        for c in range(1, 61):
            assert first_split(l, c) == first[l, c], (l, c)
            assert griewank_advances(l, c) == A[l, c], (l, c)


@pytest.mark.parametrize("L", [1, 2, 5, 9, 16, 30])
def test_revolve_forward_advances_follow_griewank(L):
    chain = homogeneous_chain(L)
    for c in range(1, L + 2):
        ops = revolve_ops(chain, c)
        advances = sum(isinstance(op, F_ck | F_n) for op in ops)
        assert advances == griewank_advances(L + 1, c), (L, c)
        schedir.simulate(chain, ops)  # valid


def test_griewank_closed_form_known_values():
    # t(l, 1) = l(l-1)/2 (only the start is stored); with l - 1 spare snapshots, l - 1.
    assert griewank_advances(10, 1) == 45
    assert griewank_advances(10, 9) == 9
    # Griewank & Walther's table: 3 snapshots, 10 steps -> r = 2 since C(5, 3) = 10.
    assert griewank_advances(10, 3) == 2 * 10 - 5  # r l - C(c + r, r - 1) = 20 - C(5, 1)


def reference_budget_search(chain, budget, schedules):
    """The earlier implementations: simulate every candidate; (chosen index, least peak)."""
    traces = [schedir.simulate(chain, ops) for ops in schedules]
    return traces, min(t.peak_memory for t in traces)


def test_chen_and_revolve_answer_as_their_reference_search():
    rng = random.Random(2)
    for _ in range(40):
        L = rng.randint(0, 9)
        chain = random_chain(rng, L)
        chen = [chen_ops(chain, k) for k in range(1, L + 2)]
        chen_traces, chen_least = reference_budget_search(chain, 0, chen)
        binomial = [revolve_ops(chain, c) for c in range(L + 1, 0, -1)]
        rev_traces, rev_least = reference_budget_search(chain, 0, binomial)
        bounds = loss_lower_bounds(chain)
        for c, trace in zip(range(L + 1, 0, -1), rev_traces, strict=True):
            assert bounds[c] <= trace.peak_memory
        for k, trace in enumerate(chen_traces, start=1):
            assert chen_cost(chain, k)[1] == trace.peak_memory
            assert chen_cost(chain, k)[0] == pytest.approx(trace.makespan, rel=1e-12)
        for budget in range(0, max(chen_least, rev_least) + 40, 3):
            fitting = [
                (t.makespan, k) for k, t in enumerate(chen_traces, 1) if t.peak_memory <= budget
            ]
            try:
                got = raw("chen_sqrt")(chain, budget)
                assert fitting and got.meta["segments"] == min(fitting)[1]
            except solvers.Infeasible as err:
                assert not fitting and err.min_budget == chen_least
            fits = [c for c, t in zip(range(L + 1, 0, -1), rev_traces, strict=True)
                    if t.peak_memory <= budget]  # fmt: skip
            try:
                got = raw("revolve")(chain, budget)
                assert fits and got.meta["checkpoints"] == fits[0]
            except solvers.Infeasible as err:
                assert not fits and err.min_budget == rev_least


class RandomTree:
    """A chooser of random moves, replayable from its seed."""

    def __init__(self, seed: float):
        self.seed = seed
        self.rng = random.Random(seed)

    def __call__(self, i, t, _):
        if self.rng.random() < 0.4:
            return Record()
        j = self.rng.randint(i + 1, t)
        return Split(j, None, None, self.rng.random() < 0.5 and j >= i + 2)

    def again(self):
        return RandomTree(self.seed)


def test_tree_cost_equals_the_simulator_on_random_trees():
    rng = random.Random(3)
    for _ in range(200):
        chain = random_chain(rng, rng.randint(0, 9))
        tree = RandomTree(rng.random())
        trace = schedir.simulate(chain, tree_ops(chain.length, tree.again()))
        makespan, peak = TreeCost(chain)(tree.again())
        assert peak == trace.peak_memory and makespan == pytest.approx(trace.makespan)
        for budget in (peak - 1, peak):
            assert TreeCost(chain).fits(tree.again(), None, budget) == (budget >= peak)


@pytest.mark.parametrize("L", [4, 10, 20])
def test_rotor_never_worse_than_revolve_on_homogeneous_chains(L):
    chain = homogeneous_chain(L)
    for budget in range(min_memory(chain), no_recompute_budget(chain) + 1, 2):
        rotor = schedir.simulate(chain, raw("rotor")(chain, budget)).makespan
        try:
            revolve = raw("revolve")(chain, budget)
        except solvers.Infeasible:
            continue
        assert rotor <= schedir.simulate(chain, revolve).makespan
        advances = sum(isinstance(op, F_ck | F_n) for op in revolve.ops)
        assert advances == griewank_advances(L + 1, revolve.meta["checkpoints"])


def test_chen_sqrt_default_and_forced_segments():
    chain = homogeneous_chain(15)
    free = solvers.solve(chain, 10**6, "chen_sqrt")
    assert free.meta["segments"] in range(1, 17)
    forced = solvers.solve(chain, 10**6, "chen_sqrt", segments=4)
    assert forced.meta["segments"] == 4
    # segments starting at 0, 4, 8, 12: the forward sweep keeps a_0, a_4, a_8 with F_ck
    # and the last segment is recorded outright; each segment is then recomputed once.
    assert [op.index for op in forced.ops if isinstance(op, F_ck)] == [0, 4, 8]
    with pytest.raises(ValueError, match="segments"):
        solvers.solve(chain, 10**6, "chen_sqrt", segments=0)


def test_times_that_overflow_are_refused():
    with pytest.raises(schedir.InvalidProblem, match="fwd_time, bwd_time.*fwd_time\\[1\\]"):
        schedir.Chain.from_rotor([1.0, 1e308], [1.0] * 3, [1] * 3, [0, 1, 1], [0, 0], [0] * 3)
    with pytest.raises(schedir.InvalidProblem, match="sizes too large"):
        schedir.Chain.from_rotor([1.0], [1.0] * 2, [2**62, 1], [0, 1], [0], [0] * 2)
    big = schedir.Chain.from_rotor([1e300] * 3, [1e300] * 4, [1] * 4, [0] + [1] * 3, [0] * 3,
                                   [0] * 4)  # fmt: skip
    for method in CHAIN_METHODS:
        assert math.isfinite(solvers.solve(big, 10**6, method).meta["makespan"])


def test_tradeoff_of_other_methods_says_what_it_knows():
    chain = homogeneous_chain(6)
    budgets = list(range(10, 70, 6))
    curve = solvers.tradeoff(chain, budgets, "chen_sqrt")
    for budget, value, exact, bound in zip(
        curve.budgets, curve.makespans, curve.exact, curve.lower_bounds, strict=True
    ):
        assert exact is False and bound == chain.store_all_time() <= value
        try:
            expected = schedir.simulate(chain, raw("chen_sqrt")(chain, budget)).makespan
        except solvers.Infeasible:
            expected = math.inf
        assert value == expected


@pytest.mark.parametrize("method", ["chen_sqrt", "revolve"])
def test_long_solvers_report_progress(method):
    chain = random_chain(random.Random(9), 200, regime="usual")
    calls = []
    try:
        raw(method)(chain, 0)
    except solvers.Infeasible as err:  # just below the least budget: every count is tried
        with pytest.raises(solvers.Infeasible):
            raw(method)(chain, err.min_budget - 1, progress=lambda *a: calls.append(a))
    assert calls and all(0 <= f <= 1 and isinstance(m, str) for f, m in calls)
