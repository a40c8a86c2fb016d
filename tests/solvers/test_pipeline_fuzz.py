"""Seeded fuzz of every pipeline method against independent oracles.

Random small instances (chains with zero sizes, zero times and large temporaries;
heterogeneous or identical devices, capacities near what intervals need, links with
latency only or infinite bandwidth; replication; an optional budget). For each method
the raw solver output is run in the simulator and every device's simulated peak is
compared with its capacity (never through ``solvers.solve``, which judges by itself);
the exact methods must reach the least period of the exhaustive search over every
interval mapping (``solvers.pipeline.exhaustive``), and report Infeasible exactly when
no mapping fits.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

import solvers
from schedir import Chain, Device, Link, Platform
from schedir.pipeline.problem import PipelineProblem, capacity
from schedir.pipeline.simulate import simulate_pipeline
from schedir.steady import interval_memory, training_period
from solvers.pipeline.exhaustive import all_mappings, exhaustive

INFERENCE_CASES = 200
TRAINING_CASES = 60


def _value(rng: random.Random, hi: float) -> float:
    """A time: often an integer or zero, else a float."""
    kind = rng.random()
    if kind < 0.15:
        return 0.0
    return float(rng.randint(1, int(hi))) if kind < 0.6 else rng.uniform(0.1, hi)


def random_instance(rng: random.Random, *, training: bool = False):
    """(problem, budget) of at most 3 stages and 4 devices (see the module docstring)."""
    L = rng.randint(1, 3)
    P = rng.randint(1, 4 if L < 3 else 3)
    sizes = [rng.choice([0, 1, 2, 4, rng.randint(1, 30)]) for _ in range(L + 1)]
    big_tmp = rng.random() < 0.2
    chain = Chain.from_rotor(
        [_value(rng, 4) for _ in range(L)],
        [_value(rng, 4) for _ in range(L + 1)],
        sizes,
        [0] + [rng.randint(0, 20) for _ in range(L)],
        [rng.randint(0, 60 if big_tmp else 5) for _ in range(L)],
        [rng.randint(0, 5) for _ in range(L + 1)],
    )
    weights = [rng.choice([0, rng.randint(0, 40)]) for _ in range(L)]
    pb0 = PipelineProblem(chain, weights, Platform(devices=(Device("d0"),)))
    needs = [interval_memory(pb0, i, j, rng.randint(2, 4), rng.randint(2, 4))
             for i in range(L) for j in range(i + 1, L + 1)]  # fmt: skip

    def cap():
        if rng.random() < 0.3:
            return None
        return max(0, rng.choice(needs) + rng.randint(-3, 3))

    identical = rng.random() < 0.35
    if identical:
        c = cap()
        devs = [Device(f"d{u}", 1.0, c) for u in range(P)]
        bw = rng.choice([1.0, 2.0, 10.0, math.inf])
        lat = rng.choice([0.0, 0.5])
        links = [Link(a.name, b.name, bw, lat) for a in devs for b in devs if a != b]
    else:
        devs = [Device(f"d{u}", rng.choice([0.5, 1.0, 2.0, 3.0]), cap()) for u in range(P)]
        links = [
            Link(a.name, b.name, rng.choice([1.0, 2.0, 10.0, math.inf]), rng.choice([0, 0.25, 1]))
            for a in devs
            for b in devs
            if a != b
        ]
    platform = Platform(devices=tuple(devs), links=tuple(links))
    problem = PipelineProblem(chain, weights, platform, rng.randint(1, 4), training)
    budget = rng.choice(needs) + rng.randint(0, 5) if rng.random() < 0.15 else None
    return problem, budget


def _simulated_fits(problem: PipelineProblem, schedule, budget) -> None:
    trace = simulate_pipeline(problem, schedule)
    for dev, peak in trace.device_peak.items():
        cap = capacity(problem, dev, budget)
        assert cap is None or peak <= cap, (dev, peak, cap, schedule.meta)


def _identical(problem: PipelineProblem) -> bool:
    devs, links = problem.platform.devices, problem.platform.links
    return (
        len({(d.speed, d.memory) for d in devs}) == 1
        and len({(lk.bandwidth, lk.latency) for lk in links}) <= 1
    )


def test_every_inference_method_fits_the_simulator_and_exact_ones_match_brute_force():
    rng = random.Random(1113)
    counts = {"feasible": 0, "infeasible": 0, "replicated": 0, "dp": 0}
    for _ in range(INFERENCE_CASES):
        pb, budget = random_instance(rng)
        best, arg = exhaustive(pb, pairs="all", budget=budget)
        counts["feasible" if arg else "infeasible"] += 1
        counts["replicated"] += bool(arg) and any(len(iv.devices) > 1 for iv in arg.intervals)
        methods = ["pipeline_milp", "pipeline_greedy", "eager", "dmda", "heft"]
        if _identical(pb):
            methods.append("pipeline_dp")
            counts["dp"] += 1
        for method in methods:
            entry = solvers.get(method, pb)
            options = {"items": 12} if not entry.exact and method != "pipeline_greedy" else {}
            try:
                schedule = entry.function(pb, budget, **options)
            except solvers.Infeasible as err:
                assert not entry.exact or arg is None, (method, best, arg)
                assert err.min_budget is None  # no pipeline method computes a least budget
                continue
            _simulated_fits(pb, schedule, budget)
            assert schedule.meta["exact"] is entry.exact
            if entry.exact:
                assert arg is not None, method
                period = schedule.meta.get("model_period", schedule.meta["period"])
                assert period == pytest.approx(best, rel=1e-6), (method, period, best)
    assert min(counts.values()) >= 10, counts


def test_1f1b_fits_the_simulator_and_is_optimal_with_unlimited_memory():
    rng = random.Random(1114)
    solved = 0
    for _ in range(TRAINING_CASES):
        pb, budget = random_instance(rng, training=True)
        entry = solvers.get("pipeline_1f1b", pb)
        try:
            schedule = entry.function(pb, budget)
        except solvers.Infeasible:
            continue
        solved += 1
        _simulated_fits(pb, schedule, budget)
        if budget is None and all(d.memory is None for d in pb.platform.devices):
            # brute force: every mapping without replication, every stage order
            best = min(
                training_period(pb, m)
                for m in all_mappings(pb, replicate=False)
                for m in _orders(m)
            )
            assert schedule.meta["period"] == pytest.approx(best, rel=1e-9)
            assert schedule.meta["exact"] is True
    assert solved >= 20


def _orders(mapping):
    """The mapping itself (device sets are already every assignment of devices)."""
    return [mapping]


def test_enumeration_helpers_cover_every_assignment():
    pb, _ = random_instance(random.Random(3))
    names = [d.name for d in pb.platform.devices]
    for m in all_mappings(pb):
        used = [u for iv in m.intervals for u in iv.devices]
        assert len(used) == len(set(used)) and set(used) <= set(names)
    assert len(list(itertools.islice(all_mappings(pb), 1))) == 1
