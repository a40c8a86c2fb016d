"""Dynamic policies in the event loop: dmda against the best static mapping, noise."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pipeline_instances import random_problem

import schedir
import solvers
from schedir.dynamic import Task, TaskGraph, pipeline_graph
from schedir.pipeline.simulate import Noise, simulate_pipeline
from schedir.steady import inference_pattern
from solvers.pipeline.dynamic import run_policy
from solvers.pipeline.milp import milp_mapping

ITEMS = 120


def _static_throughput(pb, mapping, noise=None) -> float:
    trace = simulate_pipeline(pb, inference_pattern(pb, mapping), items=ITEMS, noise=noise,
                              release_interval=0.0)  # fmt: skip
    return ITEMS / trace.makespan


def test_dmda_is_within_a_reported_gap_of_the_best_static_mapping_at_zero_noise():
    rng = random.Random(20)
    ratios = []
    for _ in range(5):
        pb = random_problem(rng, L=4, P=4)
        mapping = milp_mapping(pb).mapping
        static = _static_throughput(pb, mapping)
        dyn = run_policy(pipeline_graph(pb, ITEMS), pb.platform, "dmda")
        ratios.append((ITEMS / dyn.makespan) / static)
    print("dmda / best static throughput at zero noise:", [round(r, 3) for r in ratios])
    # dmda is not bound to interval mappings, so it may also win; it never loses much
    assert min(ratios) > 0.85


def test_policies_run_every_task_once_and_respect_dependencies():
    rng = random.Random(21)
    pb = random_problem(rng, L=3, P=3, training=True)
    g = pipeline_graph(pb, 6)
    for policy in ("eager", "dmda", "heft"):
        tr = run_policy(g, pb.platform, policy, noise=Noise(0.2, 3))
        for t, task in enumerate(g.tasks):
            for p, _ in task.deps:
                assert tr.start[t] >= tr.end[p] - 1e-12
        for u in {d.name for d in pb.platform.devices}:
            spans = sorted(
                (tr.start[t], tr.end[t]) for t in range(len(g.tasks)) if tr.device[t] == u
            )
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:], strict=False))
        assert len(tr.completion) == 6


def test_runs_are_seeded():
    pb = random_problem(random.Random(22), L=3, P=3)
    g = pipeline_graph(pb, 20)
    a = run_policy(g, pb.platform, "dmda", noise=Noise(0.3, 5))
    b = run_policy(g, pb.platform, "dmda", noise=Noise(0.3, 5))
    c = run_policy(g, pb.platform, "dmda", noise=Noise(0.3, 6))
    assert a.end == b.end != c.end


def test_history_model_moves_work_away_from_a_device_slower_than_its_profile():
    devs = [schedir.Device(f"d{u}") for u in range(3)]
    plat = schedir.Platform.fully_connected(devs, 1e9)
    tasks = tuple(Task(f"t{n}", "k", 1.0, (), n, True) for n in range(300))
    g = TaskGraph(tasks)
    # find a seed whose persistent device factors make one device clearly slower
    noise = next(
        Noise(0.0, s, 0.5)
        for s in range(100)
        if max(Noise(0.0, s, 0.5).device_factors(["d0", "d1", "d2"]).values()) > 1.6
    )
    factors = noise.device_factors(["d0", "d1", "d2"])
    slow = max(factors, key=factors.get)
    # a stream (6 items in flight), so that placements happen after measurements
    tr = run_policy(g, plat, "dmda", noise=noise, window=6)
    share = Counter(tr.device)
    assert share[slow] < min(share[u] for u in share if u != slow)


def test_heft_and_dmda_on_a_general_dag():
    # a fork-join DAG: one source, 6 independent middles, one sink
    tasks = [Task("src", "s", 1.0)]
    tasks += [Task(f"m{k}", "m", 2.0, ((0, 100),)) for k in range(6)]
    tasks.append(Task("sink", "t", 1.0, tuple((k, 100) for k in range(1, 7)), 0, True))
    g = TaskGraph(tuple(tasks))
    devs = [schedir.Device("a", 2.0), schedir.Device("b"), schedir.Device("c")]
    plat = schedir.Platform.fully_connected(devs, 1000.0, 0.01)
    for policy in ("heft", "dmda", "eager"):
        tr = run_policy(g, plat, policy)
        assert tr.makespan < 1.0 / 2 + 6 * 2.0 / 2 + 1.0 / 2  # better than all on "a"


def test_registry_dynamic_methods_return_a_replayable_placement():
    pb = random_problem(random.Random(23), L=3, P=3)
    for method in ("eager", "dmda", "heft"):
        s = solvers.solve(pb, None, method, items=30)
        trace = simulate_pipeline(pb, s, release_interval=0.0)
        assert len(trace.completion) == 30
        assert trace.makespan == pytest.approx(s.meta["dynamic_makespan"], rel=0.25)
