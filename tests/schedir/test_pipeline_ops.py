"""The pipeline ops of issue 15: split backwards (Bi / W), buffers of sends and receives,
their lifetimes (schedir.pipeline.ops.effect), read by the simulator."""

from __future__ import annotations

import dataclasses
import random

import pytest

import schedir
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.pipeline.baselines import one_f_one_b_ops
from schedir.pipeline.ops import Bwd, Fwd, Recv, Send, Wgt, effect, parse_pipeline_op
from schedir.pipeline.problem import Interval, Mapping
from schedir.pipeline.schedule import ChunkPlan, PipelineSchedule


def two_devices(**split):
    c = schedir.Chain.from_rotor([1.0, 1.0], [2.0, 2.0, 0.0], [0, 3, 0], [10, 10, 0], [0, 0],
                                 [0, 0, 0])  # fmt: skip
    plat = schedir.Platform.fully_connected([schedir.Device("g0"), schedir.Device("g1")], 1.0)
    return schedir.PipelineProblem(c, (0, 0), plat, microbatches=1, training=True, **split)


def split_step() -> PipelineSchedule:
    return PipelineSchedule((
        ("g0", (Fwd(0, 1, 0), Send("a", 1, 0, "g1"), Recv("d", 1, 0, "g1"),
                Bwd(0, 1, 0, part="input"), Wgt(0, 1, 0))),
        ("g1", (Recv("a", 1, 0, "g0"), Fwd(1, 2, 0), Bwd(1, 2, 0, part="input"),
                Send("d", 1, 0, "g0"), Wgt(1, 2, 0))),
    ), {})  # fmt: skip


def test_split_backward_times_and_lifetimes_by_hand():
    pb = two_devices(wgrad_fraction=(0.5, 0.5), wgrad_bytes=(4, 4))
    tr = schedir.simulate_pipeline(pb, split_step())
    when = {r.op: (r.start, r.end) for r in tr.records}
    # a_1 (3 bytes) takes 3 s each way; Bi and W take half of the 2 s backward each
    assert when["Send(a1,0,g1)"] == (1.0, 4.0) and when["Bi(1:2,0)"] == (5.0, 6.0)
    assert when["W(1:2,0)"] == (6.0, 7.0) and when["Send(d1,0,g0)"] == (6.0, 9.0)
    assert when["Bi(0:1,0)"] == (9.0, 10.0) and when["W(0:1,0)"] == (10.0, 11.0)
    # g0: from 0 a_1 (3) and the stash: saved_size (10) less a_1, which its abar holds
    # (the buffer the send reads: counted once, it lives until the backward); d_1
    # arrives from 6; Bi frees stash, a_1 and d_1 at 10 and W holds 4 bytes until 11
    assert schedir.simulate_pipeline(pb, split_step()).memory["g0"] == (
        (0.0, 0.0, 0.0, 6.0, 10.0, 10.0, 10.0, 10.0, 11.0),
        (0, 3, 10, 13, 10, 3, 0, 4, 0),
    )
    # g1: the receive buffer from the transfer's start (1), d_1 from Bi's start until
    # its send ends (9), W's 4 bytes from 6 to 7
    assert tr.memory["g1"] == ((0.0, 1.0, 5.0, 6.0, 6.0, 7.0, 9.0), (0, 3, 6, 3, 7, 3, 0))
    assert tr.device_peak == {"g0": 13, "g1": 7} and tr.makespan == 11.0


def test_effect_reads_the_split_from_the_problem():
    pb = two_devices(wgrad_fraction=(0.25, 0.5), wgrad_bytes=(4, 6))
    e = effect(pb, "g0", Bwd(0, 1, 0, 0.5, part="input"))
    assert e.work == 2.0 * 0.75 + 0.5 and e.allocs_end == ((("g0", "w", (0, 1), 0), 4),)
    assert effect(pb, "g0", Wgt(0, 1, 0)).work == 0.5
    assert effect(pb, "g1", Bwd(1, 2, 0)).work == 2.0  # full: both parts (loss time 0)
    # without wgrad_bytes the input part frees nothing: W frees the stash and a_1
    e = effect(two_devices(), "g1", Bwd(1, 2, 0, part="input"))
    assert e.allocs_end == () and e.releases == ()
    assert effect(two_devices(), "g1", Wgt(1, 2, 0)).releases == (
        ("g1", "w", (1, 2), 0),
        ("g1", "s", (1, 2), 0),
        ("g1", "a", 1, 0),
    )


def with_split_backwards(schedule: PipelineSchedule) -> PipelineSchedule:
    """Every Bwd replaced by its input part followed at once by its weight part."""
    lists = []
    for dev, ops in schedule.ops:
        out = []
        for o in ops:
            if isinstance(o, Bwd):
                out += [
                    Bwd(o.first, o.last, o.mb, o.recompute, "input"),
                    Wgt(o.first, o.last, o.mb),
                ]
            else:
                out.append(o)
        lists.append((dev, tuple(out)))
    return dataclasses.replace(schedule, ops=tuple(lists))


@pytest.mark.parametrize("seed", range(6))
def test_default_split_reproduces_the_full_backward(seed):
    """Without wgrad fields a Bi followed by its W is the full Bwd: same times, same
    memory curves (random chains, 3 devices, 1F1B)."""
    rng = random.Random(seed)
    L = 5
    c = schedir.Chain(
        fwd_time=tuple(rng.uniform(0.1, 2) for _ in range(L)) + (0.0,),
        bwd_time=tuple(rng.uniform(0.1, 3) for _ in range(L + 1)),
        in_size=tuple(rng.randint(0, 9) for _ in range(L + 1)),
        saved_size=tuple(rng.randint(0, 20) for _ in range(L)) + (0,),
        fwd_tmp=tuple(rng.randint(0, 5) for _ in range(L)) + (0,),
        bwd_tmp=tuple(rng.randint(0, 5) for _ in range(L + 1)),
    )
    devs = [schedir.Device(f"g{k}", speed=rng.choice([1.0, 2.0])) for k in range(3)]
    pb = schedir.PipelineProblem(c, [1] * L, schedir.Platform.fully_connected(devs, 4.0, 0.1),
                                 microbatches=4, training=True)  # fmt: skip
    m = Mapping((Interval(0, 2, ("g0",)), Interval(2, 3, ("g1",)), Interval(3, L, ("g2",))))
    s = one_f_one_b_ops(pb, m)
    full, split = (
        schedir.simulate_pipeline(pb, s),
        schedir.simulate_pipeline(pb, with_split_backwards(s)),
    )
    assert split.makespan == full.makespan and split.device_peak == full.device_peak
    # with footprints too (the rotor plans of pipeline_1f1b)
    fp = s.with_plans((ChunkPlan(0, 2, "g0", 50), ChunkPlan(2, 3, "g1", 7),
                       ChunkPlan(3, L, "g2", 30)))  # fmt: skip
    full = schedir.simulate_pipeline(pb, fp)
    split = schedir.simulate_pipeline(pb, with_split_backwards(fp))
    assert split.makespan == full.makespan and split.device_peak == full.device_peak


def test_footprint_counts_a_gradient_waiting_for_its_backward():
    """Inside a footprint the incoming gradient is counted from its transfer's start to
    its backward's start (issue 15: before, only while in transfer)."""
    c = schedir.Chain.from_rotor([1.0, 1.0], [4.0, 2.0, 0.0], [0, 3, 0], [10, 10, 0], [0, 0],
                                 [0, 0, 0])  # fmt: skip
    plat = schedir.Platform.fully_connected([schedir.Device("g0"), schedir.Device("g1")], 1.0)
    pb = schedir.PipelineProblem(c, (0, 0), plat, microbatches=2, training=True)
    s = PipelineSchedule((
        ("g0", (Fwd(0, 1, 0), Send("a", 1, 0, "g1"), Fwd(0, 1, 1), Send("a", 1, 1, "g1"),
                Recv("d", 1, 0, "g1"), Bwd(0, 1, 0), Recv("d", 1, 1, "g1"), Bwd(0, 1, 1))),
        ("g1", (Recv("a", 1, 0, "g0"), Fwd(1, 2, 0), Bwd(1, 2, 0), Send("d", 1, 0, "g0"),
                Recv("a", 1, 1, "g0"), Fwd(1, 2, 1), Bwd(1, 2, 1), Send("d", 1, 1, "g0"))),
    ), plans=(ChunkPlan(0, 1, "g0", 100), ChunkPlan(1, 2, "g1", 100)))  # fmt: skip
    tr = schedir.simulate_pipeline(pb, s)
    when = {r.op: (r.start, r.end) for r in tr.records}
    assert when["Send(d1,1,g0)"] == (10.0, 13.0) and when["B(0:1,0)"] == (10.0, 14.0)
    # from 10 to 14 g0 holds both footprints and d_1 of micro-batch 1 (arrived at 13)
    times, levels = tr.memory["g0"]
    assert [lv for t, lv in zip(times, levels, strict=True) if 10 <= t < 14][-1] == 203
    assert tr.device_peak["g0"] == 203


def test_ops_print_and_parse():
    for op in (Bwd(0, 3, 5, part="input"), Bwd(0, 3, 5, 0.25, "input"), Wgt(1, 2, 0),
               Bwd(0, 3, 5), Bwd(2, 3, 1, 0.5)):  # fmt: skip
        assert parse_pipeline_op(str(op)) == op
    assert str(Bwd(0, 3, 5, part="input")) == "Bi(0:3,5)" and str(Wgt(0, 3, 5)) == "W(0:3,5)"
    assert str(Bwd(0, 3, 5)) == "B(0:3,5)"  # today's print of a full backward
    pb = two_devices(wgrad_fraction=(0.5, 0.5), wgrad_bytes=(4, 4))
    s = split_step()
    assert schedir.PipelineSchedule.from_dict(s.to_dict()) == s
    back = schedir.PipelineProblem.from_dict(pb.to_dict())
    assert back == pb and back.wgrad_bytes == (4, 4)
    assert "wgrad_fraction" not in two_devices().to_dict()  # today's JSON unchanged


def test_bad_split_ops_and_fields_are_refused():
    pb = two_devices()
    with pytest.raises(InvalidSchedule, match="part = 'weights'"):
        Bwd(0, 1, 0, part="weights")
    with pytest.raises(InvalidSchedule, match="cannot parse"):
        parse_pipeline_op("W(0:1)")
    only_w = PipelineSchedule((("g0", (Fwd(0, 2, 0), Wgt(0, 2, 0))),), {})
    with pytest.raises(InvalidSchedule, match=r"W\(0:2,0\) before its input-gradient"):
        schedir.simulate_pipeline(pb, only_w)
    after_full = PipelineSchedule((("g0", (Fwd(0, 2, 0), Bwd(0, 2, 0), Wgt(0, 2, 0))),), {})
    with pytest.raises(InvalidSchedule, match="input-gradient backward Bi"):
        schedir.simulate_pipeline(pb, after_full)
    with pytest.raises(InvalidSchedule, match=r"B\(0:2,0\) before its forward"):
        schedir.simulate_pipeline(pb, PipelineSchedule((("g0", (Bwd(0, 2, 0),)),), {}))
    for field, value, message in [
        ("wgrad_fraction", (0.5, 1.5), r"wgrad_fraction\[1\] = 1.5"),
        ("wgrad_fraction", (0.5,), "expected 2 entries"),
        ("wgrad_fraction", (0.5, float("nan")), r"wgrad_fraction\[1\]"),
        ("wgrad_bytes", (1, -1), r"wgrad_bytes\[1\] = -1"),
        ("wgrad_bytes", (1, 2.5), r"wgrad_bytes\[1\] = 2.5"),
        ("wgrad_bytes", "ab", "expected a list"),
    ]:
        with pytest.raises(InvalidProblem, match=message):
            two_devices(**{field: value})


def test_the_loss_chunk_holds_its_target_and_a_bad_target_is_refused():
    """``target_bytes``: the labels the chunk with the loss holds from its forward's
    start to its backward's end (counted in its stash); a JSON round trip keeps it."""
    pb = two_devices(target_bytes=5)
    fwd = effect(pb, "g1", Fwd(1, 2, 0))
    assert fwd.allocs == ((("g1", "s", (1, 2), 0), 0 + 5),)  # saved_size[1] + the target
    assert effect(two_devices(), "g0", Fwd(0, 1, 0)).allocs[-1] == (("g0", "s", (0, 1), 0), 7)
    assert schedir.PipelineProblem.from_dict(pb.to_dict()).target_bytes == 5
    assert "target_bytes" not in two_devices().to_dict()
    with pytest.raises(InvalidProblem, match="target_bytes"):
        two_devices(target_bytes=-1)
