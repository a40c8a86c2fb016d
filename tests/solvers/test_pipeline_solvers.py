"""Pipeline solvers: MILP = exhaustive, DP = MILP = exhaustive on identical devices,
greedy within a reported gap, 1F1B, and the master-worker LP = its closed form."""

from __future__ import annotations

import math
import random

import pytest
from pipeline_instances import random_problem

import schedir
import solvers
from schedir.pipeline.simulate import simulate_pipeline
from schedir.steady import MasterWorker, evaluate
from solvers.pipeline.dp import dp_mapping
from solvers.pipeline.exhaustive import exhaustive
from solvers.pipeline.greedy import greedy_mapping
from solvers.pipeline.master_worker_lp import bandwidth_centric, steady_state_lp
from solvers.pipeline.milp import milp_mapping
from solvers.pipeline.one_f_one_b import best_1f1b, sub_chain


def test_milp_equals_exhaustive_search_on_small_heterogeneous_instances():
    rng = random.Random(10)
    for _ in range(12):
        pb = random_problem(rng, L=rng.randint(1, 4), P=rng.randint(1, 4), memory=True)
        best, _ = exhaustive(pb, pairs="all")
        if math.isinf(best):
            with pytest.raises(solvers.Infeasible):
                milp_mapping(pb)
            continue
        got = milp_mapping(pb)
        obj, mapping = got.objective, got.mapping
        assert obj == pytest.approx(best, rel=1e-6)
        rep = evaluate(pb, mapping, pairs="all")
        assert rep.fits and rep.period == pytest.approx(best, rel=1e-6)
        assert evaluate(pb, mapping).period <= rep.period + 1e-12  # exact order: never worse


def test_dp_equals_milp_and_exhaustive_on_identical_devices():
    rng = random.Random(11)
    for _ in range(10):
        pb = random_problem(rng, L=rng.randint(1, 5), P=rng.randint(1, 4), identical=True,
                            memory=True)  # fmt: skip
        best, _ = exhaustive(pb)
        if math.isinf(best):
            continue
        period, mapping = dp_mapping(pb)
        assert period == pytest.approx(best, rel=1e-9)
        assert evaluate(pb, mapping).period == pytest.approx(period, rel=1e-9)
        if pb.length <= 4:
            assert milp_mapping(pb).objective == pytest.approx(period, rel=1e-6)


def test_dp_refuses_heterogeneous_devices():
    pb = random_problem(random.Random(0), L=3, P=3)
    if len({d.speed for d in pb.platform.devices}) > 1:
        with pytest.raises(schedir.InvalidProblem, match="identical"):
            dp_mapping(pb)


def test_greedy_gap_to_the_optimum_is_small():
    """Reported gap on 60 random instances (L <= 5, P <= 4): mean and worst."""
    rng = random.Random(12)
    gaps = []
    for _ in range(60):
        pb = random_problem(rng, L=rng.randint(1, 5), P=rng.randint(1, 4), memory=True)
        best, _ = exhaustive(pb, pairs="used")
        if math.isinf(best):
            continue
        period, mapping = greedy_mapping(pb)
        assert evaluate(pb, mapping).fits
        gaps.append(period / best - 1)
    assert min(gaps) >= -1e-9
    mean, worst = sum(gaps) / len(gaps), max(gaps)
    print(f"greedy gap: mean {mean:.3f}, worst {worst:.3f}, optimal {sum(g < 1e-9 for g in gaps)}"
          f"/{len(gaps)}")  # fmt: skip
    assert mean < 0.08 and worst < 0.6


def test_registry_runs_the_mapping_solvers_and_the_schedule_simulates_to_its_period():
    pb = random_problem(random.Random(13), L=4, P=3)
    for method in ("pipeline_milp", "pipeline_greedy"):
        s = solvers.solve(pb, None, method)
        assert s.meta["method"] == method and s.meta["period"] > 0
        trace = simulate_pipeline(pb, s, items=120, release_interval=0.0)
        assert trace.period == pytest.approx(s.meta["period"], rel=1e-9)


def test_1f1b_is_exact_for_its_model_and_uses_rotor_when_memory_is_short():
    chain = schedir.load("examples/chain_small.json")
    L = chain.length
    devs = [schedir.Device("fast", 2.0), schedir.Device("s1"), schedir.Device("s2")]
    plat = schedir.Platform.fully_connected(devs, 1e4, 0.0)
    pb = schedir.PipelineProblem(chain, [10] * L, plat, 8, True)
    best = best_1f1b(pb)
    period, mapping, rec, exact = best.period, best.mapping, best.recompute, best.exact
    assert exact
    assert rec == [0.0] * len(mapping.intervals)  # unlimited memory: no recompute
    s = solvers.get("pipeline_1f1b", pb).function(pb)
    assert s.meta["period"] == pytest.approx(period)
    # short memory: every device gets 60% of what store-all needs on the whole chain
    need = sum(chain.saved_size) + sum(chain.in_size) + 10 * L
    tight = [schedir.Device(d.name, d.speed, int(0.6 * need)) for d in devs]
    pb2 = schedir.PipelineProblem(chain, [10] * L, schedir.Platform.fully_connected(tight, 1e4),
                                  8, True)  # fmt: skip
    best2 = best_1f1b(pb2)
    period2, mapping2, rec2, per_mb = best2.period, best2.mapping, best2.recompute, best2.footprints
    assert any(rec2)  # some stage recomputes
    assert period2 >= period - 1e-12
    for iv, b in zip(mapping2.intervals, per_mb, strict=True):
        dev = pb2.platform.device(iv.devices[0])
        assert b <= dev.memory - sum(pb2.weights[iv.first : iv.last])


def test_sub_chain_keeps_the_real_loss_only_at_the_end():
    chain = schedir.load("examples/chain_small.json")
    L = chain.length
    whole = sub_chain(chain, 0, L)
    assert whole == schedir.Chain(chain.fwd_time, chain.bwd_time, chain.in_size,
                                  chain.saved_size, chain.fwd_tmp, chain.bwd_tmp)  # fmt: skip
    mid = sub_chain(chain, 1, 3)
    assert mid.length == 2 and mid.bwd_time[-1] == 0 and mid.in_size[-1] == chain.in_size[3]


def _random_star(rng: random.Random) -> MasterWorker:
    n = rng.randint(1, 8)
    master = schedir.Device("m", rng.uniform(0.5, 2))
    workers = [schedir.Device(f"w{i}", rng.uniform(0.2, 3)) for i in range(n)]
    plat = schedir.Platform.star(master, workers, [rng.uniform(1, 100) for _ in workers])
    return MasterWorker(plat, "m", rng.uniform(0.5, 5), rng.randint(1, 200), rng.random() < 0.7)


def test_master_worker_lp_equals_bandwidth_centric_on_random_stars():
    rng = random.Random(14)
    worst = 0.0
    for _ in range(200):
        mw = _random_star(rng)
        lp, closed = steady_state_lp(mw), bandwidth_centric(mw)
        worst = max(worst, abs(lp.throughput - closed.throughput) / closed.throughput)
    assert worst < 1e-9


def test_master_worker_lp_on_a_tree_respects_ports_and_beats_its_star_part():
    devs = [schedir.Device(n, s) for n, s in [("m", 1.0), ("a", 1.0), ("b", 2.0), ("c", 4.0)]]
    links = [
        schedir.Link("m", "a", 10.0),
        schedir.Link("a", "b", 10.0),
        schedir.Link("a", "c", 5.0),
    ]
    mw = MasterWorker(schedir.Platform(devices=tuple(devs), links=tuple(links)), "m", 2.0, 10)
    ss = solvers.get("master_worker_lp", mw).function(mw)
    for u, rate in ss.compute.items():
        assert rate * mw.compute_time(u) <= 1 + 1e-9
    assert ss.send["m", "a"] * 1.0 <= 1 + 1e-9  # c = 10 bytes / 10 bytes/s
    assert ss.send["a", "b"] * 1.0 + ss.send["a", "c"] * 2.0 <= 1 + 1e-9
    # m's port is the bottleneck: at most 1 task/s reaches the subtree, m computes 0.5
    assert ss.throughput == pytest.approx(1.5)


def test_solvers_never_hand_out_a_schedule_over_a_device_memory_issue_instance():
    # issue 11, item 13: the MILP chose [0:1) on d0 + d1 and [1:2) on d2, which holds 22
    # bytes (two inputs arriving at once and one in use) on 18 bytes
    chain = schedir.Chain.from_rotor([2, 1], [1, 1, 1], [1, 4, 1], [1, 4, 1], [0, 0], [0, 0, 0])
    devs = [schedir.Device("d0", memory=9), schedir.Device("d1", memory=9),
            schedir.Device("d2", memory=18)]  # fmt: skip
    pb = schedir.PipelineProblem(chain, [0, 10], schedir.Platform.fully_connected(devs, 1))
    best, arg = exhaustive(pb)
    assert best == 3.0 and arg.intervals == (schedir.pipeline.Interval(0, 2, ("d2",)),)
    for method in ("pipeline_milp", "pipeline_greedy"):
        raw = solvers.get(method, pb).function(pb)
        trace = simulate_pipeline(pb, raw)
        assert all(
            trace.device_peak[d.name] <= d.memory for d in devs if d.name in trace.device_peak
        )
        assert raw.meta["period"] == 3.0


def test_dp_charges_the_senders_of_a_replicated_interval():
    # identical devices of 20 bytes: [0:2) on two devices, [2:3) on the third made it
    # hold 10 + 3 x 4 = 22 bytes (two inputs arriving at once and one in use)
    chain = schedir.Chain.from_rotor([2, 1, 2], [1] * 4, [3, 3, 4, 4], [1] * 4, [0] * 3, [0] * 4)
    devs = [schedir.Device(f"d{u}", memory=20) for u in range(3)]
    pb = schedir.PipelineProblem(chain, [0, 2, 10], schedir.Platform.fully_connected(devs, 1))
    period, mapping = dp_mapping(pb)
    assert period == exhaustive(pb)[0]
    trace = simulate_pipeline(pb, solvers.get("pipeline_dp", pb).function(pb))
    assert max(trace.device_peak.values()) <= 20


def test_a_time_limited_milp_says_so_and_keeps_to_its_limit():
    import time

    pb = random_problem(random.Random(5), L=8, P=5, memory=True)
    calls = []
    start = time.perf_counter()
    try:
        s = solvers.get("pipeline_milp", pb).function(
            pb, time_limit=1.0, progress=lambda f, msg: calls.append((f, msg))
        )
    except solvers.Infeasible as err:  # no incumbent within the limit: said so, no least budget
        assert "time limit" in str(err) and err.min_budget is None
    else:
        trace = simulate_pipeline(pb, s)
        for u, peak in trace.device_peak.items():
            memory = pb.platform.device(u).memory
            assert memory is None or peak <= memory
        if s.meta.get("time_limited"):
            assert s.meta["exact"] is False
            assert (s.meta.get("lower_bound") or 0) <= s.meta["model_period"] * (1 + 1e-6)
        else:
            assert s.meta["exact"] is True
    assert time.perf_counter() - start < 1.0 + 2.0  # the limit, plus building the model
    assert calls and all(0 <= f <= 1 for f, _ in calls)


def test_1f1b_cut_short_is_not_called_exact():
    chain = schedir.load("examples/chain_small.json")
    devs = [schedir.Device(f"g{u}") for u in range(3)]
    pb = schedir.PipelineProblem(chain, [0] * chain.length,
                                 schedir.Platform.fully_connected(devs, 1e4), 4, True)  # fmt: skip
    full = solvers.get("pipeline_1f1b", pb).function(pb)
    short = solvers.get("pipeline_1f1b", pb).function(pb, max_candidates=5)
    assert full.meta["exact"] is True and short.meta["exact"] is False
    assert short.meta["period"] >= full.meta["period"] - 1e-12


@pytest.mark.parametrize("method", ["pipeline_dp", "pipeline_greedy", "pipeline_milp"])
def test_interval_mapping_methods_refuse_training_problems(method):
    """Their model has no backward and no stash: on a training problem they planned
    mappings the simulator found over the budget (peak 430 > 380); now they refuse."""
    chain = schedir.load("examples/chain_small.json")
    devs = [schedir.Device("g0", 1.0, 4000), schedir.Device("g1", 2.0, 4000)]
    platform = schedir.Platform.fully_connected(devs, 100.0)
    pb = schedir.PipelineProblem(chain, [10] * chain.length, platform, 4, True)
    with pytest.raises(NotImplementedError, match=f"{method} plans inference.*pipeline_1f1b"):
        solvers.solve(pb, 380, method)


QUIET_SOLVES = """
import random, schedir, solvers
tiny = schedir.Chain.from_rotor([2, 1], [1, 1, 1], [1, 4, 1], [1, 4, 1], [0, 0], [0, 0, 0])
three = [schedir.Device("d0", memory=9), schedir.Device("d1", memory=9),
         schedir.Device("d2", memory=18)]
solvers.solve(schedir.PipelineProblem(tiny, [0, 10], schedir.Platform.fully_connected(three, 1)),
              None, "pipeline_milp")
pair = schedir.Platform.fully_connected([schedir.Device("g0"), schedir.Device("g1")], 10.0)
solvers.solve(schedir.PipelineProblem(tiny, [1, 1], pair, microbatches=2, training=True),
              None, "pipeline_joint_milp")
ch = schedir.Chain.from_rotor([1, 2], [3, 4, 1], [10, 20, 30], [0, 25, 35], [0, 0], [0, 0, 0])
solvers.solve(schedir.OffloadProblem(ch, schedir.Platform(device_memory=200)), 200, "offload_milp")
w = schedir.OffloadProblem(ch, schedir.Platform.host_offload(10.0), weight_size=[20, 30, 0])
solvers.solve(w, 400, "weight_offload", algorithm="milp")
"""


def test_highs_solvers_print_nothing_when_called_from_python():
    """HiGHS prints a banner when a process creates its first solver (once per process,
    so only a fresh process can show it): every HiGHS caller goes through
    solvers._highs, and a fresh process that solves with each prints nothing at all."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", QUIET_SOLVES], cwd=root, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "", proc.stdout[:500]
