"""Dynamic training in the simulator: the training task graph, the runtime's rules
(admission under memory caps, DTR's eviction, freeing), the policies, and the
steady-state LP as an upper bound of every run."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter

import pytest
from pipeline_instances import random_problem

import schedir
import solvers
from schedir import CopyEngine, Device, InvalidProblem, Platform
from schedir.dynamic import (
    SOURCES,
    Datum,
    GroupCosts,
    Task,
    TaskGraph,
    pipeline_graph,
    simulate_dynamic,
    training_graph,
    training_task_graph,
)
from schedir.dynamic.runtime.residency import PINNED
from schedir.pipeline.baselines import gpipe_ops
from schedir.pipeline.simulate import Noise, simulate_pipeline
from solvers.pipeline.dynamic import POLICIES, make_policy, run_policy
from solvers.pipeline.training_lp import bound_of_trace, training_lp

POLICY_NAMES = ["eager", "dmda", "dmdas", "heft", "guided"]


def _with_host(platform: Platform, bandwidth: float = 20.0) -> Platform:
    engine = CopyEngine(bandwidth)
    return dataclasses.replace(platform, offload=engine, prefetch=engine)


def _check_run(graph: TaskGraph, platform: Platform, trace, caps: dict) -> None:
    """Every task once, dependencies respected, one task at a time per device, the
    memory the runtime counted never above a device's cap."""
    assert all(not math.isnan(e) for e in trace.end)
    for t, task in enumerate(graph.tasks):
        for p, _ in task.deps:
            assert trace.start[t] >= trace.end[p] - 1e-12, (task.name, graph.tasks[p].name)
    for u in (d.name for d in platform.devices):
        spans = sorted((trace.start[t], trace.end[t]) for t in range(len(graph.tasks))
                       if trace.device[t] == u)  # fmt: skip
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:], strict=False))
        cap = caps.get(u)
        if cap is not None:
            assert max(trace.memory[u][1]) <= cap
            assert trace.device_peak[u] <= cap
    assert len(trace.completion) == len({t.item for t in graph.tasks if t.item is not None})


def test_training_graph_structure():
    pb = random_problem(random.Random(0), L=4, P=3, training=True, microbatches=5)
    g = training_graph(pb, cuts=(0, 1, 3, 4))
    kinds = Counter(t.kind[0] for t in g.tasks)
    assert kinds == {"F": 15, "B": 15, "W": 3}
    assert g.groups == ((0, 1), (1, 3), (3, 4))
    names = {d.name: d for d in g.data}
    assert names["s1[2]"].recompute and names["s1[2]"].size == sum(pb.chain.saved_size[1:3])
    assert names["w1"].kind == "param" and names["w1"].size == sum(pb.weights[1:3])
    assert names["acc2"].kind == "accumulator" and names["u0"].kind == "output"
    # a backward reads what its forward read, so a dropped stash can be rebuilt
    for task in g.tasks:
        if task.kind[0] == "B":
            fwd = g.tasks[task.deps[0][0]]
            assert set(fwd.reads) <= set(task.reads)
    # the update of a group comes after all of its backwards
    w2 = next(t for t in g.tasks if t.kind == "W2")
    assert {g.tasks[p].name for p, _ in w2.deps} == {f"B2[{n}]" for n in range(5)}


def test_invalid_graphs_are_refused_with_the_field_named():
    x = Datum("x", 4, "activation")
    with pytest.raises(InvalidProblem, match="no task writes it"):
        TaskGraph((Task("a", "a", 1.0, reads=(0,)),), (x,))
    with pytest.raises(InvalidProblem, match="written by several tasks"):
        TaskGraph((Task("a", "a", 1.0, writes=(0,)), Task("b", "b", 1.0, writes=(0,))), (x,))
    with pytest.raises(InvalidProblem, match="does not depend on its writer"):
        TaskGraph((Task("a", "a", 1.0, writes=(0,)), Task("b", "b", 1.0, reads=(0,))), (x,))
    with pytest.raises(InvalidProblem, match="must read its producer's inputs"):
        TaskGraph((Task("a", "a", 1.0, reads=(0,), writes=(1,)),
                   Task("b", "b", 1.0, ((0, 4),), reads=(1,))),
                  (Datum("w", 4, "param"), Datum("s", 4, "stash", recompute=True)))  # fmt: skip
    with pytest.raises(InvalidProblem, match="kind = 'weights'"):
        Datum("w", 4, "weights")
    with pytest.raises(InvalidProblem, match="size"):
        Datum("w", -1, "param")
    with pytest.raises(InvalidProblem, match="out of range"):
        TaskGraph((Task("a", "a", 1.0, writes=(3,)),), (x,))
    with pytest.raises(InvalidProblem, match="microbatches"):
        training_task_graph([GroupCosts(0, 1, 1.0, 1.0, 0.0, 4, 4, 4, 4)], 0)


@pytest.mark.parametrize("seed", range(4))
def test_static_plans_in_the_runtime_match_the_pipeline_simulator(seed):
    """Oracle: without memory limits or host links, a 1F1B or GPipe schedule executed
    as static lists by the runtime has exactly the makespan of simulate_pipeline."""
    pb = random_problem(random.Random(seed), L=4, P=4, training=True, microbatches=6)
    s = solvers.solve(pb, None, "pipeline_1f1b")
    g = training_graph(pb)
    for sched in (s, gpipe_ops(pb, s.mapping)):
        ours = run_policy(g, pb.platform, "static", plan=sched)
        assert ours.makespan == pytest.approx(simulate_pipeline(pb, sched).makespan, rel=1e-12)


def test_hand_computed_memory_of_one_device():
    """Oracle: one device, two groups, one micro-batch, no limit: the bytes counted
    after every event are the hand-computed ones."""
    costs = [GroupCosts(0, 1, 1.0, 2.0, 0.5, 3, 10, 7, 7, 1, 2, 7),
             GroupCosts(1, 2, 1.0, 2.0, 0.5, 5, 20, 11, 11, 0, 4, 11)]  # fmt: skip
    g = training_task_graph(costs, 1)
    plat = Platform(devices=(Device("d0"),))
    tr = run_policy(g, plat, "heft")
    order = [g.tasks[t].name for t in sorted(range(len(g.tasks)), key=lambda t: tr.start[t])]
    assert order == ["F0[0]", "F1[0]", "B1[0]", "B0[0]", "W0", "W1"]
    # bytes after the events of each instant (a task's end frees before the next begins):
    # t=0 F0: x 3 + w0 7 + s0 10 + a1 5 + temp 1 = 26
    # t=1 F0 ends (temp) and F1 begins: + w1 11 + s1 20 = 56
    # t=2 B1: + acc1 11 + d1 5 + temp 4 = 76
    # t=4 B1 ends: s1 20, a1 5 (both readers ran), temp 4 freed; B0: + acc0 7 + temp 2 = 56
    # t=6 B0 ends: x, s0, d1, temp freed (36); W0: + u0 7 = 43
    # t=6.5 W0 ends: w0, acc0 freed (29); W1: + u1 11 = 40
    # t=7 W1 ends: w1, acc1 freed, the two updates kept: 18
    times, levels = tr.memory["d0"]
    assert times == (0.0, 1.0, 2.0, 4.0, 6.0, 6.5, 7.0)
    assert levels == (26, 56, 76, 56, 43, 40, 18)
    assert tr.device_peak["d0"] == 76


def test_dtr_evicts_by_cost_per_byte_and_staleness_not_by_age_alone():
    """Two recomputable stashes of the same size: the older one costs 3 s to
    recompute, the newer 1 s. At the admission that needs room, h = cost / (size *
    staleness) is 3 / (4 * 4) for the older and 1 / (4 * 3) for the newer: DTR drops
    the newer (LRU would drop the older). Offloading would cost 80 s."""
    data = (Datum("w", 0, "param"), Datum("s1", 4, "stash", True), Datum("s2", 4, "stash", True),
            Datum("big", 6, "activation"))  # fmt: skip
    tasks = (
        Task("P1", "P1", 3.0, reads=(0,), writes=(1,)),
        Task("P2", "P2", 1.0, ((0, 0),), reads=(0,), writes=(2,)),
        Task("X", "X", 3.0, ((1, 0),)),
        Task("Q", "Q", 1.0, ((2, 0),), writes=(3,)),
        Task("R1", "R", 1.0, ((0, 4), (3, 0)), reads=(0, 1)),
        Task("R2", "R", 1.0, ((1, 4), (4, 0)), reads=(0, 2)),
        Task("R3", "R", 1.0, ((3, 6), (5, 0)), reads=(3,)),
    )
    g = TaskGraph(tasks, data)
    slow = CopyEngine(0.1)  # a host link so slow that offloading costs more than recomputing
    plat = Platform(offload=slow, prefetch=slow, devices=(Device("d0", 1.0, 10),))
    tr = run_policy(g, plat, "heft")
    assert [(name, mode) for _, name, _, mode in tr.evictions] == [("s2", "drop")]
    assert tr.rebuilt[5] and tr.recompute[5] == pytest.approx(1.0)  # R2 rebuilt s2 (P2: 1 s)
    _check_run(g, plat, tr, {"d0": 10})


@pytest.mark.parametrize("seed", range(3))
def test_every_policy_runs_training_within_the_memory_caps(seed):
    rng = random.Random(100 + seed)
    pb = random_problem(rng, L=4, P=4, training=True, microbatches=6)
    g = training_graph(pb)
    modes = Counter()
    # without host links only stashes can go (dropped): a looser cap (a tight one can
    # stall, reported: test_a_memory_deadlock_is_reported)
    for host, cap in ((False, 500), (True, 350)):
        plat = _with_host(pb.platform) if host else pb.platform
        caps = {d.name: cap for d in plat.devices}
        for policy in POLICY_NAMES:
            tr = run_policy(g, plat, policy, noise=Noise(0.3, seed), memory=caps)
            _check_run(g, plat, tr, caps)
            modes.update(mode for *_, mode in tr.evictions)
            assert host or "offload" not in modes
    assert modes["drop"] and modes["offload"] and modes["free"]  # every path ran


def _run_keeping_state(graph, platform, policy: str, caps, **options):
    """``simulate_dynamic`` under the named policy; returns the trace and the run's
    :class:`RuntimeState` (kept from the policy's ``complete`` calls)."""
    state = None

    class Recorder:  # the policy, keeping the state to look at after the run
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def complete(self, t, u, seconds, st):
            nonlocal state
            state = st
            return self.inner.complete(t, u, seconds, st)

    pol = Recorder(make_policy(policy, graph, platform, memory=caps))
    return simulate_dynamic(graph, platform, pol, memory=caps, **options), state


def _check_nothing_left(state) -> None:
    """After a run: no copy of a datum on a device but outputs' and accumulators', and
    none on the host but the sources' (what no task reads is freed everywhere)."""
    mem, kind = state._memory, state.layout.kind
    for d in range(len(kind)):
        if kind[d] not in PINNED:
            assert not mem.copies[d], (state.layout.name[d], mem.copies[d])
        if kind[d] not in SOURCES:
            assert not mem.on_host[d], state.layout.name[d]


@pytest.mark.parametrize(("seed", "cap", "policy"), [(5, 350, "eager"), (7, 350, "dmdas"),
                                                     (24, 500, "guided")])  # fmt: skip
def test_an_offload_whose_datum_dies_meanwhile_frees_both_copies(seed, cap, policy):
    """A copy being offloaded from one device while its last reader runs on another
    (a reader that rebuilt it there): the offload holds its bytes until it ends, and
    then neither copy is kept (these runs raised KeyError in the state's bookkeeping)."""
    rng = random.Random(seed)
    pb = random_problem(rng, L=rng.randint(3, 6), P=rng.randint(2, 4), training=True,
                        microbatches=rng.randint(3, 8))  # fmt: skip
    g = training_graph(pb)
    plat = _with_host(pb.platform, 200.0)
    caps = {d.name: cap for d in plat.devices}
    tr, state = _run_keeping_state(g, plat, policy, caps, noise=Noise(0.3, seed))
    _check_run(g, plat, tr, caps)
    assert any(mode == "offload" for *_, mode in tr.evictions)
    _check_nothing_left(state)


def test_seeded_random_runs_complete_or_stall_with_the_reason():
    """Random pipelines (training and inference graphs, random cuts, host links or none,
    memory caps, windows, prefetch on and off, noise) under every policy: each run
    completes (dependencies, one task at a time per device, the caps, nothing left
    behind) or stalls with ``InvalidProblem`` naming the tasks left; nothing else. (A
    wider fuzz, 2,700 training runs with host links, found the three runs of the test
    above, whose ``KeyError`` these 300 runs do not meet.)"""
    done, stalled = 0, 0
    for seed in range(60):
        rng = random.Random(seed)
        L = rng.randint(2, 6)
        pb = random_problem(rng, L=L, P=rng.randint(1, 4), training=rng.random() < 0.8,
                            microbatches=rng.randint(2, 6))  # fmt: skip
        cuts = (0, *sorted(rng.sample(range(1, L), rng.randint(0, L - 1))), L)
        g = (training_graph(pb, cuts=cuts, update_time=rng.choice([0.0, 0.5]))
             if pb.training else pipeline_graph(pb, rng.randint(2, 6), cuts))  # fmt: skip
        plat = _with_host(pb.platform, rng.choice([2.0, 20.0, 200.0]))
        if rng.random() < 0.3:
            plat = pb.platform
        cap = rng.choice([None, 250, 350, 500, 800])
        caps = {} if cap is None else {d.name: cap for d in plat.devices}
        for policy in POLICY_NAMES:
            options = dict(
                noise=Noise(rng.choice([0.0, 0.3]), seed),
                prefetch=rng.random() < 0.7,
                window=rng.choice([None, 1, 2, 3]),
            )
            try:
                tr, state = _run_keeping_state(g, plat, policy, caps, **options)
            except InvalidProblem as err:
                assert "dynamic run stalled; unfinished tasks" in str(err), (seed, policy)
                stalled += 1
                continue
            _check_run(g, plat, tr, caps)
            _check_nothing_left(state)
            done += 1
    assert done > 150 and stalled  # both outcomes are exercised (184 and 116 runs)


def test_runs_are_seeded_and_policies_named():
    pb = random_problem(random.Random(7), L=3, P=3, training=True, microbatches=5)
    g = training_graph(pb)
    a = run_policy(g, pb.platform, "dmdas", noise=Noise(0.3, 5))
    b = run_policy(g, pb.platform, "dmdas", noise=Noise(0.3, 5))
    c = run_policy(g, pb.platform, "dmdas", noise=Noise(0.3, 6))
    assert a.end == b.end != c.end
    with pytest.raises(ValueError, match="policy = 'fifo'"):
        make_policy("fifo", g, pb.platform)
    assert set(POLICY_NAMES) <= set(POLICIES)


def test_guided_follows_its_plan_and_never_loses_to_it_without_noise():
    for seed in range(4):
        pb = random_problem(random.Random(seed), L=4, P=4, training=True, microbatches=6)
        s = solvers.solve(pb, None, "pipeline_1f1b")
        g = training_graph(pb)
        static = run_policy(g, pb.platform, "static", plan=s)
        guided = run_policy(g, pb.platform, "guided", plan=s)
        assert guided.makespan <= static.makespan * (1 + 1e-12)
        # of several plans it follows the one that ends first
        both = make_policy("guided", g, pb.platform, plan=[s, "heft"])
        heft = run_policy(g, pb.platform, "heft")
        best = min(static.makespan, heft.makespan)
        assert simulate_dynamic(g, pb.platform, both).makespan <= best * (1 + 1e-12)


def test_guided_replans_when_a_device_is_persistently_slower():
    pb = random_problem(random.Random(3), L=4, P=4, training=True, microbatches=16)
    g = training_graph(pb)
    names = [d.name for d in pb.platform.devices]
    noise = next(Noise(0.05, s, 0.5) for s in range(200)
                 if max(Noise(0.05, s, 0.5).device_factors(names).values()) > 1.8)  # fmt: skip
    pol = make_policy("guided", g, pb.platform, plan="heft")
    tr = simulate_dynamic(g, pb.platform, pol, noise=noise)
    assert pol.replans >= 1
    assert tr.makespan < run_policy(g, pb.platform, "heft", noise=noise).makespan
    # per-task noise alone does not make it re-plan
    pol = make_policy("guided", g, pb.platform, plan="heft")
    simulate_dynamic(g, pb.platform, pol, noise=Noise(0.3, 1))
    assert pol.replans == 0


def test_plan_from_schedule_refuses_ops_that_cut_groups():
    pb = random_problem(random.Random(4), L=4, P=2, training=True, microbatches=3)
    s = solvers.solve(pb, None, "pipeline_1f1b")
    g = training_graph(pb, cuts=(0, 2, 4))
    if any(iv.first % 2 for iv in s.mapping.intervals):
        with pytest.raises(InvalidProblem, match="does not cover whole groups"):
            run_policy(g, pb.platform, "static", plan=s)
    with pytest.raises(InvalidProblem, match="misses tasks"):
        run_policy(g, pb.platform, "static", plan={"d0": [0]})


def test_a_task_that_fits_nowhere_stalls_with_a_clear_error():
    pb = random_problem(random.Random(2), L=3, P=2, training=True, microbatches=2)
    g = training_graph(pb)
    with pytest.raises(InvalidProblem, match="needs .* bytes at once"):
        run_policy(g, pb.platform, "dmda", memory={d.name: 60 for d in pb.platform.devices})


def test_a_memory_deadlock_is_reported():
    """No host link and a tight cap: activations of the micro-batches in flight can be
    neither offloaded nor recomputed, and fill the devices."""
    pb = random_problem(random.Random(102), L=4, P=4, training=True, microbatches=6)
    g = training_graph(pb)
    caps = {d.name: 350 for d in pb.platform.devices}
    with pytest.raises(InvalidProblem, match="dynamic run stalled.*cannot evict"):
        run_policy(g, pb.platform, "eager", noise=Noise(0.3, 2), memory=caps)
    # a host link lets the runtime offload them, and the same run completes
    tr = run_policy(g, _with_host(pb.platform), "eager", noise=Noise(0.3, 2), memory=caps)
    assert any(mode == "offload" for *_, mode in tr.evictions)


def test_lp_is_the_little_law_bound_on_a_small_case():
    """Two identical devices, two groups of 1 s forward and 1 s backward, stashes that
    cannot be dropped or offloaded, each device holding one stash: the stash of group
    0 lives 4 s (F0, F1, B1, B0), that of group 1 2 s, so 4 rho + 2 rho <= 2 stashes
    held on average: rho <= 1/3, below the compute bound 1/2."""
    s = 10
    data = [Datum("w0", 0, "param"), Datum("w1", 0, "param")]
    tasks = []
    m = 8
    for n in range(m):
        base = len(data)
        data += [Datum(f"s0[{n}]", s, "stash"), Datum(f"s1[{n}]", s, "stash")]
        f0 = len(tasks)
        tasks += [
            Task(f"F0[{n}]", "F0", 1.0, (), n, False, (0,), (base,)),
            Task(f"F1[{n}]", "F1", 1.0, ((f0, 0),), n, False, (1,), (base + 1,)),
            Task(f"B1[{n}]", "B1", 1.0, ((f0 + 1, s),), n, False, (1, base + 1)),
            Task(f"B0[{n}]", "B0", 1.0, ((f0, s), (f0 + 2, 0)), n, True, (0, base)),
        ]
    g = TaskGraph(tuple(tasks), tuple(data))
    plat = Platform.fully_connected([Device("a", 1.0, s), Device("b", 1.0, s)], 1e9)
    lp = training_lp(g, plat)
    assert lp.throughput == pytest.approx(1 / 3, rel=1e-6)
    assert training_lp(g, plat, memory={"a": None, "b": None}).throughput == pytest.approx(0.5)
    # a run that fits: group 0 on a, group 1 on b, one micro-batch at a time (the
    # greedy policies start a second forward and deadlock: nothing can be evicted)
    lists = {"a": [t for t, k in enumerate(tasks) if k.kind[1] == "0"],
             "b": [t for t, k in enumerate(tasks) if k.kind[1] == "1"]}  # fmt: skip
    tr = run_policy(g, plat, "static", plan=lists)
    assert tr.throughput == pytest.approx(m / (4 * m))
    assert tr.throughput <= lp.throughput


@pytest.mark.parametrize("seed", range(3))
def test_lp_bound_is_never_exceeded(seed):
    """Every run, any policy, noise, memory caps with drops and offloads, a device
    profile that is wrong (per-device factors): throughput <= the LP with the run's own
    durations; without noise also <= the LP at the profile's times."""
    rng = random.Random(200 + seed)
    pb = random_problem(rng, L=4, P=4, training=True, microbatches=6)
    g = training_graph(pb)
    ran, evicted = 0, Counter()
    for host, cap in ((False, None), (True, 400), (True, 330), (False, 500)):
        plat = _with_host(pb.platform) if host else pb.platform
        caps = None if cap is None else {d.name: cap for d in plat.devices}
        lp = training_lp(g, plat, memory=caps)
        for policy in POLICY_NAMES:
            for noise in (Noise(), Noise(0.3, seed), Noise(0.3, seed, 0.3)):
                try:
                    tr = run_policy(g, plat, policy, noise=noise, memory=caps)
                except InvalidProblem:
                    continue  # the caps let no run through this policy's choices
                ran += 1
                evicted.update(mode for *_, mode in tr.evictions)
                bound = bound_of_trace(g, plat, tr, memory=caps)
                assert tr.throughput <= bound.throughput * (1 + 1e-9), (policy, noise, cap)
                if noise.sigma == 0 and noise.device_sigma == 0:
                    assert tr.throughput <= lp.throughput * (1 + 1e-9), (policy, cap)
    assert ran >= 55 and evicted["drop"] and evicted["offload"], (ran, evicted)  # of 60


def test_lp_reports_its_solution():
    pb = random_problem(random.Random(9), L=3, P=3, training=True, microbatches=4)
    g = training_graph(pb)
    lp = training_lp(g, pb.platform)
    assert lp.throughput > 0 and lp.period == pytest.approx(1 / lp.throughput)
    assert lp.meta["solve_time"] >= 0 and lp.meta["links"]
    per_kind = Counter()
    for (kind, _), rate in lp.rates.items():
        per_kind[kind] += rate
    # every kind runs at its share of the throughput (forwards: one per micro-batch)
    assert per_kind["F0"] == pytest.approx(lp.throughput, rel=1e-6)
    assert per_kind["W0"] == pytest.approx(lp.throughput / 4, rel=1e-6)
    assert set(lp.residence) and all(r > 0 for r in lp.residence.values())
    assert isinstance(schedir.Device("x"), Device)
