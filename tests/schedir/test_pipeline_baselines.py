"""Published pipeline schedules under uniform costs: their bubbles and per-device peaks
equal the formulas of docs/pipelines.md ("Baselines") exactly (issue 15 acceptance).

Uniform costs as in Qi et al. (2023): every chunk's forward, input gradient and weight
gradient take one unit (T_F = T_B = T_W = 1: fwd_time 1, bwd_time 2, wgrad_fraction
1/2), no communication (sizes 0, links of infinite bandwidth), a stash of M_B bytes
per chunk and micro-batch, M_W <= M_B bytes held between B and W. The default run
checks p in 2..8 with m in {p, p + 1, 2p - 2, 2p - 1, 2p, 3p, 4p}; the slow one every
m in p..4p.
"""

from __future__ import annotations

import pytest

import schedir
from schedir.errors import InvalidSchedule
from schedir.pipeline.baselines import (
    BASELINES,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    v_shape,
    zb_h1,
    zb_h2,
)
from schedir.pipeline.steps import step_report

MB, MW = 6, 2


def uniform(p: int, m: int, v: int = 1, mw: int = MW) -> schedir.PipelineProblem:
    L = p * v
    c = schedir.Chain(fwd_time=(1.0,) * L + (0.0,), bwd_time=(2.0,) * L + (0.0,),
                      in_size=(0,) * (L + 1), saved_size=(MB,) * L + (0,),
                      fwd_tmp=(0,) * (L + 1), bwd_tmp=(0,) * (L + 1))  # fmt: skip
    plat = schedir.Platform.fully_connected(
        [schedir.Device(f"d{k}") for k in range(p)], float("inf"))  # fmt: skip
    return schedir.PipelineProblem(c, [0] * L, plat, microbatches=m, training=True,
                                   wgrad_fraction=(0.5,) * L, wgrad_bytes=(mw,) * L)  # fmt: skip


def grid(full: bool):
    for p in range(2, 9):
        ms = range(p, 4 * p + 1) if full else sorted({p, p + 1, 2 * p - 2, 2 * p - 1, 2 * p,
                                                       3 * p, 4 * p} - {p - 1})  # fmt: skip
        for m in ms:
            if m >= p:
                yield p, m


def peaks(report, p: int) -> list[int]:
    return [report.device_peak[f"d{d}"] for d in range(p)]


def check_formulas(p: int, m: int) -> None:
    pb = uniform(p, m)
    # 1F1B (and GPipe): bubble (p - 1)(T_F + T_B + T_W), rate (p - 1) / m
    r = step_report(pb, one_f_one_b(pb), steps=2)
    assert r.period == 3 * (m + p - 1) and r.bubble == 3 * (p - 1)
    assert r.bubble_rate == pytest.approx((p - 1) / m, rel=1e-12)
    assert peaks(r, p) == [(p - d) * MB for d in range(p)]
    one_peak = max(peaks(r, p))
    # ZB-H1: bubble (p - 1)(T_F + T_B - T_W), a third of 1F1B's; 1F1B's peak
    r = step_report(pb, zb_h1(pb), steps=2)
    assert r.period == 3 * m + p - 1 and r.bubble == p - 1
    assert peaks(r, p) == [(p - d) * MB + d * MW for d in range(p)]
    assert max(peaks(r, p)) == one_peak
    # ZB-H2: bubble (p - 1)(T_F + T_B - 2 T_W) = 0 once m >= 2p - 1 (else 2p - 1 - m),
    # peak min(m, 2p - 1) M_B on the first device
    r = step_report(pb, zb_h2(pb), steps=2)
    assert r.bubble == max(0, 2 * p - 1 - m) and r.period == 3 * m + max(0, 2 * p - 1 - m)
    if m >= 2 * p - 1:
        assert peaks(r, p) == [(2 * p - 1 - 2 * d) * MB + 2 * d * MW for d in range(p)]
    assert peaks(r, p)[0] == min(m, 2 * p - 1) * MB
    # interleaved 1F1B (m a multiple of p), v = 2: bubble (p - 1)(T_F + T_B) / v per
    # device (F, B of a device = v chunks), rate (p - 1) / (v m); device d holds
    # min(2 (p - d - 1) + (v - 1) p + 1, v m) chunk stashes
    if m % p == 0:
        v = 2
        pv = uniform(p, m, v)
        r = step_report(pv, interleaved_1f1b(pv, chunks=v), steps=2)
        assert r.bubble == 3 * (p - 1) and r.period == 3 * v * m + 3 * (p - 1)
        assert r.bubble_rate == pytest.approx((p - 1) / (v * m), rel=1e-12)
        assert peaks(r, p) == [min(2 * (p - d - 1) + (v - 1) * p + 1, v * m) * MB
                               for d in range(p)]  # fmt: skip


@pytest.mark.parametrize("p", range(2, 9))
def test_bubbles_and_peaks_equal_the_published_formulas(p):
    for pp, m in grid(full=False):
        if pp == p:
            check_formulas(p, m)


@pytest.mark.slow
def test_bubbles_and_peaks_on_every_m_from_p_to_4p():
    for p, m in grid(full=True):
        check_formulas(p, m)


def test_gpipe_holds_every_micro_batch():
    pb = uniform(4, 8)
    r = step_report(pb, gpipe(pb), steps=2)
    assert r.period == 3 * (8 + 4 - 1) and peaks(r, 4) == [8 * MB] * 4


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_v_shape_halves_1f1b_memory_with_less_bubble(p):
    """The V-shape building block on the same model (2p stages: two chunks per device
    against two stages per device for 1F1B): at most half of 1F1B's peak (two thirds
    for p < 4) and a shorter step."""
    for m in (p, 2 * p, 4 * p):
        pb = uniform(p, m, v=2)
        one = step_report(pb, one_f_one_b(pb), steps=2)
        vee = step_report(pb, v_shape(pb), steps=2)
        limit = 1 / 2 if p >= 4 else 2 / 3
        assert max(peaks(vee, p)) <= limit * max(peaks(one, p))
        assert vee.period < one.period


def test_schedules_are_valid_on_profiled_heterogeneous_stages():
    """On a profiled chain with communication every baseline runs and the simulator
    finds no missing message (chunks of balanced work, 4 devices)."""
    chain = schedir.load("examples/profiles/transformer.json")
    devs = [schedir.Device(f"g{k}", speed=s) for k, s in enumerate([1.0, 1.0, 0.8, 1.2])]
    plat = schedir.Platform.fully_connected(devs, 10e9, 1e-5)
    L = chain.length
    pb = schedir.PipelineProblem(chain, [1000] * L, plat, microbatches=8, training=True,
                                 wgrad_fraction=(0.5,) * L)  # fmt: skip
    for name, make in BASELINES.items():
        s = make(pb)
        r = step_report(pb, s, steps=2)
        assert r.period > 0 and r.throughput == 8 / r.period, name
        assert schedir.PipelineSchedule.from_dict(s.to_dict()) == s


def test_bad_baseline_requests_are_refused():
    with pytest.raises(InvalidSchedule, match="multiple of the pipeline depth"):
        interleaved_1f1b(uniform(4, 6, v=2))
    with pytest.raises(InvalidSchedule, match="training problem"):
        pb = uniform(2, 2)
        one_f_one_b(schedir.PipelineProblem(pb.chain, pb.weights, pb.platform, 2, False))
    with pytest.raises(InvalidSchedule, match="cannot cut 2 stages into 4"):
        interleaved_1f1b(uniform(2, 2), chunks=2)
    with pytest.raises(InvalidSchedule, match="expected 3 cut points"):
        one_f_one_b(uniform(2, 2), cuts=[0, 2])
