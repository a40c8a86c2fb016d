"""weight_offload: weights on the host, prefetched ahead of their stage (docs/offload.md)."""

import itertools
import math
import random

import pytest

import solvers
from schedir import Chain, InvalidProblem, OffloadProblem, Platform, simulate_offload
from solvers.chain.store_all import store_all_ops
from solvers.offload.weight_offload import Decision, emit, fits, instance, milp, min_budget, window


def random_chain(L: int, rng: random.Random) -> Chain:
    return Chain.from_rotor(
        [rng.uniform(0.5, 2) for _ in range(L)],
        [rng.uniform(0.5, 3) for _ in range(L + 1)],
        [rng.randint(1, 10) for _ in range(L + 1)],
        [0] + [rng.randint(1, 20) for _ in range(L)],
        [rng.randint(0, 5) for _ in range(L)],
        [rng.randint(0, 5) for _ in range(L + 1)],
    )


def random_problem(L: int, rng: random.Random, bandwidth=None) -> OffloadProblem:
    weights = [rng.randint(5, 40) for _ in range(L)] + [rng.choice([0, 3])]
    bw = rng.uniform(3, 40) if bandwidth is None else bandwidth
    platform = Platform.host_offload(bw, latency=rng.choice([0.0, 0.1]))
    return OffloadProblem(random_chain(L, rng), platform, weight_size=weights)


def least(problem: OffloadProblem) -> int:
    return min_budget(instance(problem, store_all_ops(problem.chain)))


def test_valid_milp_never_slower_than_greedy_and_milp_value_is_simulated():
    rng = random.Random(0)
    for _ in range(8):
        p = random_problem(rng.randint(2, 5), rng)
        for extra in (0, 25, 80):
            budget = least(p) + extra
            m = solvers.solve(p, budget, "weight_offload", algorithm="milp")
            g = solvers.solve(p, budget, "weight_offload", algorithm="greedy")
            for s in (m, g):
                trace = simulate_offload(p, s)
                assert trace.peak_memory <= trace.program_peak <= budget
                assert s.meta["makespan"] >= s.meta["lower_bound"] - 1e-9
            assert m.meta["exact"]
            assert m.meta["makespan"] <= g.meta["makespan"] + 1e-9
            assert m.meta["milp_value"] == pytest.approx(m.meta["makespan"], abs=1e-6)


def test_milp_equals_brute_force_on_tiny_chains():
    rng = random.Random(1)
    for _ in range(6):
        p = random_problem(rng.randint(1, 2), rng)
        inst = instance(p, store_all_ops(p.chain))
        for budget in (least(p), least(p) + 30):
            per_use = [
                [("s", s) for s in window(inst, u)] + ([] if inst.first[u] else [("k", None)])
                for u in range(len(inst.uses))
            ]
            waits = [range(b, inst.n + 1) for b, _ in inst.grads]
            best = math.inf
            for cu in itertools.product(*per_use):
                slots = [s for kind, s in cu if kind == "s"]
                if slots != sorted(slots):  # the model's FIFO prefetch order
                    continue
                for cw in itertools.product(*waits):
                    d = Decision([k == "k" for k, _ in cu], [s for _, s in cu], list(cw))
                    if fits(inst, d, budget):
                        best = min(best, simulate_offload(p, emit(inst, d)[0]).makespan)
            found, exact, value = milp(inst, budget)
            assert exact and value == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize("algorithm", ["milp", "greedy"])
def test_infinite_bandwidth_makespan_is_compute_time(algorithm):
    rng = random.Random(2)
    for _ in range(4):
        p = random_problem(rng.randint(2, 5), rng, bandwidth=math.inf)
        p = OffloadProblem(p.chain, Platform.host_offload(math.inf), weight_size=p.weight_size)
        s = solvers.solve(p, least(p), "weight_offload", algorithm=algorithm)
        assert s.meta["makespan"] == pytest.approx(p.chain.store_all_time(), rel=1e-12)
        assert s.meta["makespan"] == pytest.approx(s.meta["compute_time"], rel=1e-12)


@pytest.mark.parametrize("algorithm", ["milp", "greedy"])
def test_weights_that_fit_do_not_stall(algorithm):
    L = 5
    chain = Chain.from_rotor(
        [1.0] * L, [1.0] * (L + 1), [4] * (L + 1), [0] + [6] * L, [0] * L, [0] * (L + 1)
    )
    weights = (10,) * L + (0,)
    # every transfer (10 bytes at 20 B/s: 0.5 s) is shorter than the op it can overlap
    p = OffloadProblem(chain, Platform.host_offload(20.0), weight_size=weights)
    store_all = simulate_offload(p.__class__(chain, p.platform), store_all_ops(chain)).peak_memory
    budget = store_all + 2 * sum(weights)
    s = solvers.solve(p, budget, "weight_offload", algorithm=algorithm)
    # only the cold start's first prefetch and the last gradient offload are exposed
    assert s.meta["makespan"] == pytest.approx(s.meta["lower_bound"], rel=1e-12)
    assert s.meta["lower_bound"] == pytest.approx(chain.store_all_time() + 0.5 + 0.5)
    if algorithm == "greedy":  # the MILP may prefetch again at no cost in time
        assert s.meta["kept"] == L  # every backward reuses the forward's copy


def test_below_the_minimum_budget_is_infeasible():
    rng = random.Random(3)
    p = random_problem(4, rng)
    inst = instance(p, store_all_ops(p.chain))
    need = min_budget(inst)
    # the largest single stage's weights (and gradient at B) + its activations
    stage = max(
        inst.need[j - 1] + inst.size[u] + (p.weight_size[k] if j > p.chain.length + 1 else 0)
        for u, (j, k, _) in enumerate(inst.uses)
    )
    assert need >= stage >= max(p.weight_size)
    with pytest.raises(solvers.Infeasible) as err:
        solvers.solve(p, need - 1, "weight_offload")
    assert err.value.min_budget == need
    assert solvers.solve(p, need, "weight_offload").meta["peak_memory"] <= need


def test_rotor_compute_sequence_greedy_on_a_long_chain_and_errors():
    rng = random.Random(4)
    p = random_problem(4, rng)
    budget = least(p) - 5  # store-all does not fit, rotor's recomputation does
    with pytest.raises(solvers.Infeasible):
        solvers.solve(p, budget, "weight_offload")
    s = solvers.solve(p, budget + 200, "weight_offload", compute="rotor", algorithm="milp")
    assert s.meta["peak_memory"] <= budget + 200
    big = random_problem(60, rng)
    s = solvers.solve(big, least(big) + 50, "weight_offload")  # auto: greedy
    assert s.meta["solver"] == "greedy" and "FIFO" in s.meta["overlap_model"]
    with pytest.raises(InvalidProblem, match="weight_size"):
        solvers.solve(OffloadProblem(p.chain, p.platform), 10**6, "weight_offload")
