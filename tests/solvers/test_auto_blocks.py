"""The block chain (schedir.blocks) and its DP (solvers.block_rotor), without JAX.

The simulator is checked by hand on a skip connection; the DP against an exhaustive
search over every persistent (tree-shaped) schedule and every option choice on random
block chains of up to 3 stages with skip connections, values without cotangents,
backwards that free part of their stage's buffers before their peak, a
non-empty a_0 and options that break the usual inequalities (large temporaries, zero
sizes): at every budget it finds the brute-force optimum, and its least budget is the
least budget of any persistent schedule.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

import schedir
import solvers
from schedir import B, F_all, F_ck, F_n, InvalidProblem, InvalidSchedule, Loss
from schedir.blocks.problem import BlockChain, BlockOption, BlockStage
from schedir.blocks.schedule import BlockSchedule
from schedir.blocks.simulate import simulate_blocks
from solvers.blocks.rotor import _Sizes, _Table, least_memory, least_slots


def opt(name="o", saved=0, rec_time=1.0, rec_tmp=0, bwd_time=2.0, bwd_tmp=0):
    return BlockOption(name, saved, rec_time, rec_tmp, bwd_time, bwd_tmp)


def skip_chain() -> BlockChain:
    """Three stages; value 3 (8 bytes) is made by stage 0 and read by stage 2 (a skip)."""
    stages = (
        BlockStage("s0", 1.0, 0, (), (opt(saved=5), opt("none", 0, 1.0, 0, 3.0, 0))),
        BlockStage("s1", 1.0, 0, (0,), (opt(saved=5),)),
        BlockStage("s2", 1.0, 0, (1, 3), (opt(saved=5),)),
    )
    return BlockChain(
        value_sizes=(10, 10, 10, 8),
        grad_sizes=(10, 10, 10, 8),
        cuts=((), (0, 3), (1, 3), (2,)),
        stages=stages,
        loss_time=1.0,
        loss_tmp=0,
    )


def test_skip_value_counts_once():
    p = skip_chain()
    ops = [F_all(0), F_all(1), F_all(2), Loss(), B(2), B(1), B(0)]
    trace = simulate_blocks(p, BlockSchedule(ops, {}, [0, 0, 0]))
    # after F_all(2): abar1 = {0, 3} + 5, abar2 = {1, 3} + 5, abar3 = {2} + 5: 3 counted once
    assert trace.resident[2] == 10 + 8 + 5 + 10 + 5 + 10 + 5
    # Loss adds d[3] (10) and keeps abar[3]; B(2) adds d[2], new cotangents of 1 and 3
    assert trace.resident[3] == trace.resident[2] + 10
    assert trace.op_peak[4] == trace.resident[3] + 10 + 8
    # B(1) does not read 3: d[1] keeps d[2]'s cotangent of 3 (same array)
    assert trace.op_peak[5] == trace.resident[4] + 10
    chain = p.to_chain([0, 0, 0])
    assert schedir.simulate(chain, ops).peak_memory >= trace.peak_memory


def test_errors_name_the_field():
    p = skip_chain()
    ops = [F_all(0), F_all(1), F_all(2), Loss(), B(2), B(1), B(0)]
    with pytest.raises(InvalidSchedule, match="a BlockSchedule naming one option per stage"):
        simulate_blocks(p, ops)
    with pytest.raises(InvalidSchedule, match="options\\[0\\] = 2"):
        simulate_blocks(p, BlockSchedule(ops, {}, [2, 0, 0]))
    with pytest.raises(InvalidSchedule, match="op 1: B\\(0\\): needs d\\[1\\]"):
        simulate_blocks(p, BlockSchedule([F_all(0), B(0)], {}, [0, 0, 0]))
    with pytest.raises(InvalidProblem, match="value 3 is in cuts \\[1, 3\\]"):
        BlockChain((1, 1, 1, 1), (1, 1, 1, 1), ((), (0, 3), (1,), (2, 3)), p.stages, 1.0, 0)
    with pytest.raises(InvalidProblem, match="stages\\[1\\] \\(s2\\).reads: values \\[1\\]"):
        BlockChain((1,) * 4, (1,) * 4, p.cuts, (p.stages[0], p.stages[2], p.stages[2]), 1.0, 0)


# ------------------------------------------------------------- brute force


def random_chain(rng: random.Random, L: int) -> BlockChain:
    sizes, grads, cuts = [], [], [set() for _ in range(L + 1)]
    reads = [set() for _ in range(L)]

    def value(first_cut: int, last_reader: int, size: int, grad: bool) -> None:
        v = len(sizes)
        sizes.append(size)
        grads.append(size if grad else 0)
        for c in range(first_cut, last_reader + 1):
            cuts[c].add(v)
        if last_reader < L:
            reads[last_reader].add(v)

    if rng.random() < 0.3:  # an input resident from the start, read by stage 0
        value(0, 0, rng.randint(1, 6), rng.random() < 0.5)
    for c in range(1, L + 1):  # the main path: made by stage c-1, read by stage c
        value(c, c, rng.randint(0, 10), rng.random() < 0.85)
    for _ in range(rng.randint(0, 2)):  # skips and passive values
        if L >= 2:
            p = rng.randint(0, L - 2)
            u = rng.randint(p + 2, L)
            value(p + 1, u, rng.randint(1, 8), rng.random() < 0.6)
    stages = []
    for k in range(L):
        options = [
            opt(
                f"o{j}",
                saved=rng.choice([0, rng.randint(0, 12)]),
                rec_time=round(rng.uniform(0.5, 2), 2),
                rec_tmp=rng.choice([0, rng.randint(0, 15)]),
                bwd_time=round(rng.uniform(1, 4), 2),
                bwd_tmp=rng.choice([0, rng.randint(0, 15)]),
            )
            for j in range(rng.randint(1, 3))
        ]
        fwd_tmp = rng.choice([0, rng.randint(0, 15)])
        stages.append(BlockStage(f"s{k}", round(rng.uniform(0.5, 2), 2), fwd_tmp, tuple(reads[k]),
                                 tuple(options)))  # fmt: skip
    loss_time, loss_tmp = round(rng.uniform(0.5, 2), 2), rng.choice([0, rng.randint(0, 10)])
    cuts = tuple(tuple(c) for c in cuts)
    p = BlockChain(tuple(sizes), tuple(grads), cuts, tuple(stages), loss_time, loss_tmp)

    # backwards that free some of the stage's own buffers before their peak (phases)
    def release(k: int, o: BlockOption) -> BlockOption:
        top = o.saved + p.own_bytes(k)
        return dataclasses.replace(o, bwd_release=rng.choice([0, rng.randint(0, top)]))

    released = tuple(
        dataclasses.replace(stage, options=tuple(release(k, o) for o in stage.options))
        for k, stage in enumerate(p.stages)
    )
    return dataclasses.replace(p, stages=released)


def trees(i: int, t: int, L: int):
    """Every persistent op sequence for stages i..t, with the stages it records."""
    if i == t + 1:
        yield ()
        return
    if i == L:
        yield (Loss(),)
        return
    for rest in trees(i + 1, t, L):
        yield (F_all(i), *rest, B(i))
    for j in range(i + 1, t + 1):
        sweep = (F_ck(i), *(F_n(k) for k in range(i + 1, j)))
        for right in trees(j, t, L):
            for left in trees(i, j - 1, L):
                yield (*sweep, *right, *left)


def brute_force(p: BlockChain, serial: bool = False) -> list[tuple[int, float]]:
    """(peak, makespan) of every persistent schedule and option choice (``serial``:
    the makespan with host copies charged whole, what the DP minimizes)."""
    out = []
    choices = itertools.product(*(range(len(s.options)) for s in p.stages))
    all_trees = list(trees(0, p.length, p.length))
    for options in choices:
        for ops in all_trees:
            trace = simulate_blocks(p, BlockSchedule(ops, {}, list(options)))
            assert trace.makespan <= trace.serial_makespan + 1e-12
            out.append((trace.peak_memory, trace.serial_makespan if serial else trace.makespan))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    p = random_chain(rng, rng.randint(1, 3))
    points = brute_force(p)
    least = min(peak for peak, _ in points)
    assert least_memory(p)[0] == least
    with pytest.raises(solvers.Infeasible) as err:
        solvers.solve(p, least - 1, method="block_rotor")
    assert err.value.min_budget == least
    peaks = {peak for peak, _ in points}
    for budget in sorted(peaks | {least + 3, max(peaks) + 5}):
        best = min(ms for peak, ms in points if peak <= budget)
        s = solvers.solve(p, budget, method="block_rotor")
        assert s.meta["exact"]
        assert s.meta["makespan"] == pytest.approx(best, abs=1e-9), (budget, s.ops)
        assert s.meta["peak_memory"] <= budget


def test_discretized_dp_fits_and_reports():
    rng = random.Random(7)
    p = random_chain(rng, 3)
    scale = 10_000
    big = BlockChain(
        tuple(v * scale for v in p.value_sizes),
        tuple(v * scale for v in p.grad_sizes),
        p.cuts,
        tuple(
            BlockStage(
                s.name,
                s.fwd_time,
                s.fwd_tmp * scale,
                s.reads,
                tuple(
                    BlockOption(
                        o.name,
                        o.saved * scale,
                        o.rec_time,
                        o.rec_tmp * scale,
                        o.bwd_time,
                        o.bwd_tmp * scale,
                        o.bwd_release * scale,
                    )
                    for o in s.options
                ),
            )
            for s in p.stages
        ),  # fmt: skip
        p.loss_time,
        p.loss_tmp * scale,
    )
    least = least_memory(big)[0]
    exact = solvers.solve(big, least, method="block_rotor", max_slots=10**9)
    assert exact.meta["exact"] and exact.meta["dp"] != "store_all"
    s = solvers.solve(big, least, method="block_rotor", max_slots=200, slots=50)
    assert s.meta["peak_memory"] <= least
    assert not s.meta["exact"] and ("discretization" in s.meta or "fallback" in s.meta)
    assert s.meta["makespan"] >= exact.meta["makespan"] - 1e-9
    assert math.isfinite(s.meta["makespan"])


@pytest.mark.parametrize("seed", range(40))
def test_least_slots_is_where_the_discretized_table_becomes_finite(seed):
    # block_rotor builds no table below least_slots: it must be exactly where one is finite
    rng = random.Random(seed)
    p = random_chain(rng, rng.randint(1, 5))
    z = _Sizes(p)
    for slot in (1, 2, 3, 7):
        least = least_slots(z, slot)
        for M in range(max(0, least - 2), least + 3):
            assert math.isfinite(_Table(p, M, slot).value(M)) == (M >= least), (slot, M)
    assert least_slots(z, 1) + z.x0 == least_memory(p)[0]


def test_ties_are_broken_towards_one_option_per_kind_of_stage():
    """Identical stages whose options tie take the same one (the compiled path keeps
    such a run as one loop); a change that would not fit or be slower is not made."""
    from solvers.blocks.rotor import uniform_options

    def chain(*options):
        stages = tuple(
            BlockStage(f"s{k}", 1.0, 0, (k - 1,) if k else (), options) for k in range(4)
        )
        return BlockChain(
            (10,) * 5, (10,) * 5, ((),) + tuple((k,) for k in range(4)), stages, 1.0, 0
        )

    ops = tuple([F_all(k) for k in range(4)] + [Loss()] + [B(k) for k in range(3, -1, -1)])

    def run(p, options):
        return simulate_blocks(p, BlockSchedule(ops, {}, list(options)))

    tie = chain(opt("small", saved=2), opt("large", saved=6))
    roomy = run(tie, [1] * 4).peak_memory
    assert uniform_options(tie, ops, [0, 1, 0, 1], roomy) == [0] * 4
    assert run(tie, [0] * 4).makespan == run(tie, [0, 1, 0, 1]).makespan
    budget = run(tie, [1, 1, 0, 1]).peak_memory  # all "large" would not fit
    assert run(tie, [1] * 4).peak_memory > budget
    assert uniform_options(tie, ops, [1, 1, 0, 1], budget) == [1, 1, 0, 1]
    trade = chain(opt("fast", saved=6, rec_time=1.0), opt("slow", saved=2, rec_time=3.0))
    assert uniform_options(trade, ops, [0, 1, 1, 1], 10**6) == [0, 1, 1, 1]  # not a tie


# ------------------------------------------------- late residuals in host memory


def late_chain(host: int, saved: int = 4, release: int = 0) -> BlockChain:
    """Two stages on a path of 10-byte values; stage 0's option keeps ``saved`` bytes
    on the device and ``host`` in host memory (its recording makes both: rec_tmp 3 +
    host), and its backward needs 7 bytes beyond what it frees (``release``)."""
    late = BlockOption("late", saved, 1.0, 3 + host, 2.0, 7 + release, release, host)
    stages = (
        BlockStage("s0", 1.0, 0, (), (late,)),
        BlockStage("s1", 1.0, 0, (1,), (opt(saved=5),)),
    )
    return BlockChain((10, 10, 10), (10, 10, 10), ((), (1,), (2,)), stages, 1.0, 0)


def test_late_residuals_counted_in_host_memory_by_hand():
    ops = [F_all(0), F_all(1), Loss(), B(1), B(0)]
    t = simulate_blocks(late_chain(host=6), BlockSchedule(ops, {}, [0, 0]))
    # F_all(0): abar1 = a1 (10) + its device part 4; the recording held the host part too
    assert (t.resident[0], t.op_peak[0]) == (14, 14 + 3 + 6)
    assert t.resident[1:3] == (14 + 15, 14 + 15 + 10)  # abar2 = 10 + 5; d2 = 10
    # B(1) frees abar2 and d2, adds d1; B(0) needs 7 over d1 and abar1, then frees all
    assert t.op_peak[4] == 10 + 14 + 7 and t.resident[4] == 0
    assert t.host_resident == (6, 6, 6, 6, 0)  # held from the recording until B(0)
    # host = 0: the same device bytes and nothing in host memory
    t0 = simulate_blocks(late_chain(host=0), BlockSchedule(ops, {}, [0, 0]))
    assert t0.resident == t.resident and t0.host_resident == (0,) * 5
    assert t0.op_peak[0] == t.op_peak[0] - 6
    # every residual late: the recording's device part is its outputs only
    t_all = simulate_blocks(late_chain(host=10, saved=0), BlockSchedule(ops, {}, [0, 0]))
    assert t_all.resident[0] == 10 and t_all.host_resident[:4] == (10,) * 4
    # recomputed (F_ck), never recorded: nothing in host memory
    ck = [F_ck(0), F_all(1), Loss(), B(1), F_all(0), B(0)]
    t_ck = simulate_blocks(late_chain(host=6), BlockSchedule(ck, {}, [0, 0]))
    assert t_ck.host_resident == (0, 0, 0, 0, 6, 0)


def test_a_backward_may_free_its_late_residuals():
    own = 10 + 10  # stage 0 makes value 1 and frees d[1]'s cotangent of it
    late_chain(host=6, saved=4, release=4 + 6 + own)  # a phase that frees them all
    with pytest.raises(InvalidProblem, match="option 'late'.bwd_release = 31: .* at most .* 30"):
        late_chain(host=6, saved=4, release=4 + 6 + own + 1)
    with pytest.raises(InvalidProblem, match="option 'x'.host = -1"):
        BlockOption("x", 0, 1.0, 0, 1.0, 0, 0, -1)
    p = late_chain(host=6)
    assert BlockChain.from_dict(p.to_dict()) == p
    old = p.to_dict()
    for stage in old["stages"]:  # JSON written before the field existed
        for o in stage["options"]:
            del o["host"]
    assert BlockChain.from_dict(old).stages[0].options[0].host == 0


def test_an_offloaded_recording_moves_its_device_part_only():
    from schedir.offload.ops import Offload, Prefetch, Wait

    ops = [F_all(0), F_all(1), Offload("abar[1]"), Wait("abar[1]"), Loss(),
           Prefetch("abar[1]"), Wait("abar[1]"), B(1), B(0)]  # fmt: skip
    t = simulate_blocks(late_chain(host=6), BlockSchedule(ops, {}, [0, 0]))
    # offloaded: the device part (10 + 4) joins the host part (6), counted once
    assert t.host_resident == (6, 6, 20, 20, 20, 20, 6, 6, 0)
    assert t.resident[3] == 15 and t.resident[5] == 25 + 14  # prefetched: its device part


@pytest.mark.parametrize("seed", range(20))
def test_dp_with_host_variants_equals_brute_force(seed):
    """Options whose recordings keep part of their residuals in host memory (a late
    variant) or all of them (an all-on-host variant, back at the backward's start):
    the device figures are those of the same option without that part (rec_tmp and
    the backward carry it, the copies' time charged to both), host memory holds it
    while the recording is held, and the DP still finds the brute-force optimum of the
    time with the copies charged whole (``serial_makespan``; the copies overlapping
    compute, ``makespan``, is never more)."""
    rng = random.Random(1000 + seed)
    p = random_chain(rng, rng.randint(1, 3))

    def variant(k: int, o: BlockOption) -> BlockOption:
        host = rng.randint(1, 6)
        top = o.saved + host + p.own_bytes(k)
        release = rng.choice([0, rng.randint(0, top)])
        out, back = rng.choice([0.0, 0.5, 2.0]), rng.choice([0.0, 1.0])
        return dataclasses.replace(o, name=o.name + "+late", rec_tmp=o.rec_tmp + host,
                                   bwd_tmp=o.bwd_tmp + host + release, bwd_release=release,
                                   host=host, rec_time=o.rec_time + out, copy_out=out,
                                   bwd_time=o.bwd_time + back, copy_back=back)  # fmt: skip

    def all_on_host(o: BlockOption) -> BlockOption:
        copy = rng.choice([0.0, 0.5, 2.0])
        return dataclasses.replace(
            o, name=o.name + "+host", saved=0, host=o.saved, rec_time=o.rec_time + copy,
            rec_tmp=o.rec_tmp + o.saved, bwd_time=o.bwd_time + copy, bwd_tmp=o.bwd_tmp + o.saved,
            copy_out=copy, copy_back=copy,
        )  # fmt: skip

    stages = tuple(
        dataclasses.replace(s, options=(*s.options, *(variant(k, o) for o in s.options),
                                        *(all_on_host(o) for o in s.options if o.saved)))
        for k, s in enumerate(p.stages)
    )  # fmt: skip
    q = dataclasses.replace(p, stages=stages)
    for options in itertools.product(*(range(len(s.options)) for s in q.stages)):
        for ops in trees(0, q.length, q.length):
            t = simulate_blocks(q, BlockSchedule(ops, {}, list(options)))
            held = [False] * q.length  # recordings held after each op, by hand
            host = []
            for op in ops:
                if isinstance(op, F_all):
                    held[op.index] = True
                elif isinstance(op, B):
                    held[op.index] = False
                host.append(sum(q.stages[k].options[options[k]].host
                                for k in range(q.length) if held[k]))  # fmt: skip
            assert list(t.host_resident) == host
    points = brute_force(q, serial=True)
    least = min(peak for peak, _ in points)
    assert least_memory(q)[0] == least
    for budget in sorted({peak for peak, _ in points}):
        best = min(ms for peak, ms in points if peak <= budget)
        s = solvers.solve(q, budget, method="block_rotor")
        t = simulate_blocks(q, s)
        assert t.serial_makespan == pytest.approx(best, abs=1e-9)
        assert s.meta["makespan"] == t.makespan <= t.serial_makespan + 1e-12
        assert s.meta["peak_memory"] <= budget
