"""Every chain method through the registry: validity, dominance of rotor, revolve's counts."""

from __future__ import annotations

import pytest
from chain_strategies import chains, homogeneous_chain
from hypothesis import given, settings
from hypothesis import strategies as st

import schedir
import solvers
from schedir import F_ck, F_n
from solvers.revolve import advances_table, griewank_advances, revolve_ops
from solvers.rotor import min_memory, no_recompute_budget

CHAIN_METHODS = ["rotor", "store_all", "recompute_all", "chen_sqrt", "revolve"]


def test_registry_lists_chain_methods_with_descriptions():
    methods = {m.name: m for m in solvers.available(schedir.Chain)}
    assert set(CHAIN_METHODS) <= set(methods)
    assert methods["rotor"].exact and not methods["revolve"].exact
    assert all(m.description for m in methods.values())


def test_unknown_method_lists_known_ones():
    chain = schedir.load("examples/chain_small.json")
    with pytest.raises(ValueError, match="unknown solver 'nope'.*rotor"):
        solvers.solve(chain, 2000, method="nope")


@pytest.mark.parametrize("budget", [-1, 1.5, float("nan"), "1GiB", True])
def test_bad_budget_is_rejected(budget):
    chain = schedir.load("examples/chain_small.json")
    with pytest.raises(schedir.InvalidProblem, match="budget"):
        solvers.solve(chain, budget)


@settings(max_examples=40, deadline=None)
@given(chains(max_length=7), st.floats(0.0, 1.3))
def test_every_method_is_valid_and_tight_rotor_dominates(chain, fraction):
    least = min_memory(chain, tight=True)
    budget = least + int(fraction * (no_recompute_budget(chain, tight=True) - least))
    best = solvers.solve(chain, budget, "rotor", model="tight").meta["makespan"]
    for method in CHAIN_METHODS:
        try:
            schedule = solvers.solve(chain, budget, method)
        except solvers.Infeasible as err:
            assert err.min_budget > budget
            continue
        trace = schedir.simulate(chain, schedule)
        assert trace.peak_memory <= budget
        assert trace.makespan == pytest.approx(schedule.meta["makespan"])
        assert best <= trace.makespan * (1 + 1e-9) + 1e-12, method


@settings(max_examples=40, deadline=None)
@given(chains(max_length=7))
def test_baselines_min_budget_is_exactly_their_least_feasible_budget(chain):
    for method in ["store_all", "recompute_all", "chen_sqrt", "revolve"]:
        try:
            solvers.solve(chain, 0, method)
            least = 0
        except solvers.Infeasible as err:
            least = err.min_budget
        schedule = solvers.solve(chain, least, method)
        assert schedir.simulate(chain, schedule).peak_memory <= least
        if least > 0:
            with pytest.raises(solvers.Infeasible):
                solvers.solve(chain, least - 1, method)


@pytest.mark.parametrize("L", [1, 2, 5, 9, 16, 30])
def test_revolve_forward_advances_follow_griewank(L):
    chain = homogeneous_chain(L)
    _, split = advances_table(L + 1, L + 1)
    for c in range(1, L + 2):
        ops = revolve_ops(chain, c, split)
        advances = sum(isinstance(op, F_ck | F_n) for op in ops)
        assert advances == griewank_advances(L + 1, c), (L, c)
        schedir.simulate(chain, ops)  # valid


def test_griewank_closed_form_known_values():
    # t(l, 1) = l(l-1)/2 (only the start is stored); with l - 1 spare snapshots, l - 1.
    assert griewank_advances(10, 1) == 45
    assert griewank_advances(10, 9) == 9
    # Griewank & Walther's table: 3 snapshots, 10 steps -> r = 2 since C(5, 3) = 10.
    assert griewank_advances(10, 3) == 2 * 10 - 5  # r l - C(c + r, r - 1) = 20 - C(5, 1)


@pytest.mark.parametrize("L", [4, 10, 20])
def test_rotor_never_worse_than_revolve_on_homogeneous_chains(L):
    chain = homogeneous_chain(L)
    for budget in range(min_memory(chain), no_recompute_budget(chain) + 1, 2):
        rotor = solvers.solve(chain, budget, "rotor").meta["makespan"]
        try:
            revolve = solvers.solve(chain, budget, "revolve")
        except solvers.Infeasible:
            continue
        assert rotor <= revolve.meta["makespan"]
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
