"""The joint planner's in-flight charge (solvers.pipeline.inflight) is what the pipeline
simulator charges, and plan_pattern never loses to storing every activation on the
balanced or even cut where that fits."""

from __future__ import annotations

import numpy as np
import pytest

import schedir
from schedir.pipeline.baselines import BASELINES
from schedir.pipeline.schedule import ChunkPlan
from schedir.pipeline.steps import step_report
from solvers.pipeline.inflight import charge, fastest_within, moments
from solvers.pipeline.joint import plan_pattern
from solvers.pipeline.stage_plans import StagePlans

CUTS = [0, 2, 4, 6, 8]


def problem(memory=None, boundary: int = 0, seed: int = 0) -> schedir.PipelineProblem:
    """8 random stages on 4 devices, 6 micro-batches; ``boundary``: bytes of the
    activations between the chunks of ``CUTS`` (0: messages carry nothing)."""
    rng = np.random.default_rng(seed)
    L = 8
    x = [int(v) for v in rng.integers(20, 100, L + 1)]
    for k in CUTS[1:-1]:
        x[k] = boundary
    chain = schedir.Chain.from_rotor(
        rng.uniform(1, 3, L).tolist(), [*rng.uniform(2, 6, L).tolist(), 0.0], x,
        [*(int(v) for v in rng.integers(300, 600, L)), 0], [0] * L, [0] * (L + 1),
    )  # fmt: skip
    devs = [schedir.Device(f"d{u}", 1.0, memory) for u in range(4)]
    plat = schedir.Platform.fully_connected(devs, 1e9)
    return schedir.PipelineProblem(chain, [0] * L, plat, 6, True)


@pytest.mark.parametrize("pattern", ["1f1b", "zb_h1", "zb_h2", "gpipe"])
def test_the_charge_is_the_simulated_peak(pattern):
    """Without message bytes or weights, every device's simulated peak is the charge of
    its op list under its chunks' plans (store-all, rotor at several budgets)."""
    pb = problem()
    plans = StagePlans(pb, offload=False)
    names = [f"d{u}" for u in range(4)]
    for share in (1.0, 0.7, 0.4):
        chosen = [plans.within(a, b, share * plans.store_all(a, b).footprint)
                  or plans.within(a, b, plans.least(a, b))
                  for a, b in zip(CUTS[:-1], CUTS[1:], strict=True)]  # fmt: skip
        s = BASELINES[pattern](pb, names, cuts=CUTS, recompute=[p.extra for p in chosen])
        chunks = zip(CUTS[:-1], CUTS[1:], names, chosen, strict=True)
        s = s.with_plans(plans.chunk_plan(ChunkPlan(a, b, u), p) for a, b, u, p in chunks)
        assert any(c.held is not None and c.held < c.footprint for c in s.plans)
        peak = schedir.simulate_pipeline(pb, s).device_peak
        rows = moments(s)
        for c in s.plans:
            sizes = {(c.first, c.last): (c.footprint, c.held)}
            assert charge(pb, rows[c.device], sizes) == peak[c.device], (share, c)


def test_fastest_within_fits_its_room_and_stores_all_when_it_can():
    pb = problem()
    plans = StagePlans(pb, offload=False)
    s = BASELINES["zb_h2"](pb, [f"d{u}" for u in range(4)], cuts=CUTS)
    rows = moments(s)["d0"]
    full = plans.reserved(0, 2, plans.store_all(0, 2))
    need = charge(pb, rows, {(0, 2): full})
    assert fastest_within(plans, pb, rows, [(0, 2)], need)[0].kind == "store_all"
    got = fastest_within(plans, pb, rows, [(0, 2)], need - 1)[0]
    assert got.kind == "rotor" and got.extra > 0
    assert charge(pb, rows, {(0, 2): plans.reserved(0, 2, got)}) <= need - 1
    assert fastest_within(plans, pb, rows, [(0, 2)], 10) is None


@pytest.mark.parametrize("pattern", ["1f1b", "zb_h1", "zb_h2", "gpipe"])
def test_never_slower_than_storing_all_on_the_even_cut(pattern):
    """At the memory the pattern needs as published on the even cut (messages
    included), plan_pattern's step is no longer; below it, it rematerializes."""
    loose = problem(boundary=64, seed=1)
    names = [f"d{u}" for u in range(4)]
    hand = BASELINES[pattern](loose, names, cuts=CUTS)
    alone = schedir.simulate_pipeline(loose, hand)
    memory = max(alone.device_peak.values())
    got = plan_pattern(problem(memory, 64, 1), pattern, names, steps=1)
    rep = step_report(problem(memory, 64, 1), got, 1)
    assert rep.period <= alone.makespan * (1 + 1e-12)
    assert max(rep.device_peak.values()) <= memory
    tight = problem(int(0.85 * memory), 64, 1)
    got = plan_pattern(tight, pattern, names, steps=1)
    assert any(c.kind == "rotor" for c in got.plans), got.plans
    assert max(schedir.simulate_pipeline(tight, got).device_peak.values()) <= 0.85 * memory
