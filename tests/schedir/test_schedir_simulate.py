"""Unit tests of every rule of the op table (docs/semantics.md, the op table).

The chain has L = 3 and every buffer size / temporary a distinct power of two, so each
expected number below identifies exactly which buffers are counted:

    a[0] = d[0] = x0 = 1      abar[1] = s0 = 16      fwd_tmp = 128, 256, 512, (loss) 0
    a[1] = d[1] = x1 = 2      abar[2] = s1 = 32      bwd_tmp = 1024, 2048, 4096, (loss) 8192
    a[2] = d[2] = x2 = 4      abar[3] = s2 = 64
    a[3] = d[3] = x3 = 8

Times: fwd_time = 1, 2, 4, (loss) 0.5; bwd_time = 8, 16, 32, (loss) 64, so
Loss() takes 0.5 + 64 = 64.5. All expected values are worked out by hand in comments.
"""

import pytest

import schedir
from schedir import B, Chain, F_all, F_ck, F_n, InvalidSchedule, Loss, Schedule, simulate

CHAIN = Chain(
    fwd_time=[1.0, 2.0, 4.0, 0.5],
    bwd_time=[8.0, 16.0, 32.0, 64.0],
    in_size=[1, 2, 4, 8],
    saved_size=[16, 32, 64, 0],
    fwd_tmp=[128, 256, 512, 0],
    bwd_tmp=[1024, 2048, 4096, 8192],
)


def run(ops, chain=CHAIN):
    return simulate(chain, ops, record_buffers=True)


def check(trace, expected):
    """expected: list of (resident buffers, resident bytes, op need) per op."""
    assert len(trace.resident) == len(expected)
    for i, (bufs, resident, need) in enumerate(expected):
        assert trace.buffers[i] == frozenset(bufs), i
        assert trace.resident[i] == resident, i
        assert trace.op_peak[i] == need, i


def test_store_all_abar_inputs_everywhere():
    ops = [F_all(0), F_all(1), F_all(2), Loss(), B(2), B(1), B(0)]
    t = run(ops)
    check(
        t,
        [
            # F_all(0): reads a[0], adds abar[1]: 1 + 16 = 17, need 17 + 128
            ({"a[0]", "abar[1]"}, 17, 145),
            # F_all(1): reads abar[1] (a[1] absent), adds abar[2]: 17 + 32 = 49, need 49 + 256
            ({"a[0]", "abar[1]", "abar[2]"}, 49, 305),
            # F_all(2): reads abar[2], adds abar[3]: 49 + 64 = 113, need 113 + 512
            ({"a[0]", "abar[1]", "abar[2]", "abar[3]"}, 113, 625),
            # Loss: reads abar[3] (a[3] absent, nothing freed), adds d[3]: 113 + 8 = 121,
            # need 121 + 8192
            ({"a[0]", "abar[1]", "abar[2]", "abar[3]", "d[3]"}, 121, 8313),
            # B(2): a[2] absent, abar[2] stays; adds d[2]: 121 + 4 = 125, need 125 + 4096;
            # removes d[3] and abar[3]: 125 - 8 - 64 = 53
            ({"a[0]", "abar[1]", "abar[2]", "d[2]"}, 53, 4221),
            # B(1): adds d[1]: 53 + 2 = 55, need 55 + 2048; removes d[2], abar[2]: 55 - 36
            ({"a[0]", "abar[1]", "d[1]"}, 19, 2103),
            # B(0): adds d[0]: 19 + 1 = 20, need 20 + 1024; removes a[0], d[1], abar[1]:
            # 20 - 1 - 2 - 16 = 1
            ({"d[0]"}, 1, 1044),
        ],
    )
    assert t.initial_memory == 1
    assert t.peak_memory == 8313
    # 1 + 2 + 4 + (0.5 + 64) + 32 + 16 + 8
    assert t.makespan == 127.5
    assert t.ops == tuple(ops)


def test_keep_and_drop_forwards_with_a_inputs():
    ops = [
        F_ck(0),
        F_n(1),
        F_n(2),
        Loss(),
        F_ck(0),
        F_ck(1),
        F_all(2),
        B(2),
        F_all(1),
        B(1),
        F_all(0),
        B(0),
    ]
    t = run(ops)
    check(
        t,
        [
            # F_ck(0): reads a[0], adds a[1]: 1 + 2 = 3, need 3 + 128
            ({"a[0]", "a[1]"}, 3, 131),
            # F_n(1): adds a[2]: 3 + 4 = 7, need 7 + 256, then removes a[1]: 7 - 2 = 5
            ({"a[0]", "a[2]"}, 5, 263),
            # F_n(2): adds a[3]: 5 + 8 = 13, need 13 + 512, removes a[2]: 13 - 4 = 9
            ({"a[0]", "a[3]"}, 9, 525),
            # Loss: reads a[3], adds d[3]: 9 + 8 = 17, need 17 + 8192, frees a[3]: 17 - 8
            ({"a[0]", "d[3]"}, 9, 8209),
            # F_ck(0) again (recomputation): 9 + 2 = 11, need 11 + 128
            ({"a[0]", "a[1]", "d[3]"}, 11, 139),
            # F_ck(1): 11 + 4 = 15, need 15 + 256
            ({"a[0]", "a[1]", "a[2]", "d[3]"}, 15, 271),
            # F_all(2): reads a[2], adds abar[3]: 15 + 64 = 79, need 79 + 512
            ({"a[0]", "a[1]", "a[2]", "abar[3]", "d[3]"}, 79, 591),
            # B(2): adds d[2]: 79 + 4 = 83, need 83 + 4096; removes a[2], d[3], abar[3]:
            # 83 - 4 - 8 - 64 = 7
            ({"a[0]", "a[1]", "d[2]"}, 7, 4179),
            # F_all(1): reads a[1], adds abar[2]: 7 + 32 = 39, need 39 + 256
            ({"a[0]", "a[1]", "abar[2]", "d[2]"}, 39, 295),
            # B(1): adds d[1]: 39 + 2 = 41, need 41 + 2048; removes a[1], d[2], abar[2]:
            # 41 - 2 - 4 - 32 = 3
            ({"a[0]", "d[1]"}, 3, 2089),
            # F_all(0): adds abar[1]: 3 + 16 = 19, need 19 + 128
            ({"a[0]", "abar[1]", "d[1]"}, 19, 147),
            # B(0): adds d[0]: 20, need 20 + 1024; removes a[0], d[1], abar[1]: 20 - 19
            ({"d[0]"}, 1, 1044),
        ],
    )
    assert t.peak_memory == 8209
    # forwards 1 + 2 + 4, Loss 64.5, recompute 1 + 2 + 4, B(2) 32, F_all(1) 2, B(1) 16,
    # F_all(0) 1, B(0) 8
    assert t.makespan == 7 + 64.5 + 7 + 32 + 2 + 16 + 1 + 8
    assert t.makespan == 137.5
    # start/end: cumulative sums of the op times
    times = [1, 2, 4, 64.5, 1, 2, 4, 32, 2, 16, 1, 8]
    clock = 0.0
    for i, dt in enumerate(times):
        assert t.start[i] == clock
        clock += dt
        assert t.end[i] == clock


def test_abar_alternatives_for_f_n_f_ck_and_b_with_both_inputs():
    ops = [F_all(0), F_all(1), F_n(2), Loss(), F_ck(1), F_all(2), B(2), F_ck(0), F_all(1)]
    ops += [B(1), B(0)]
    t = run(ops)
    check(
        t,
        [
            # F_all(0): 1 + 16 = 17, need 17 + 128
            ({"a[0]", "abar[1]"}, 17, 145),
            # F_all(1): 17 + 32 = 49, need 49 + 256
            ({"a[0]", "abar[1]", "abar[2]"}, 49, 305),
            # F_n(2): a[2] absent so it reads abar[2]; adds a[3]: 49 + 8 = 57, need 57 + 512,
            # then removes abar[2]: 57 - 32 = 25
            ({"a[0]", "abar[1]", "a[3]"}, 25, 569),
            # Loss: reads a[3]; adds d[3]: 25 + 8 = 33, need 33 + 8192; frees a[3]: 25
            ({"a[0]", "abar[1]", "d[3]"}, 25, 8225),
            # F_ck(1): a[1] absent, reads abar[1] (kept); adds a[2]: 25 + 4 = 29, need 29 + 256
            ({"a[0]", "abar[1]", "a[2]", "d[3]"}, 29, 285),
            # F_all(2): adds abar[3]: 29 + 64 = 93, need 93 + 512
            ({"a[0]", "abar[1]", "a[2]", "abar[3]", "d[3]"}, 93, 605),
            # B(2): adds d[2]: 93 + 4 = 97, need 97 + 4096; removes a[2], d[3], abar[3]:
            # 97 - 4 - 8 - 64 = 21
            ({"a[0]", "abar[1]", "d[2]"}, 21, 4193),
            # F_ck(0): adds a[1] although abar[1] is resident (distinct buffers):
            # 21 + 2 = 23, need 23 + 128
            ({"a[0]", "a[1]", "abar[1]", "d[2]"}, 23, 151),
            # F_all(1): adds abar[2]: 23 + 32 = 55, need 55 + 256
            ({"a[0]", "a[1]", "abar[1]", "abar[2]", "d[2]"}, 55, 311),
            # B(1): both a[1] and abar[1] resident: a[1] is removed, abar[1] stays.
            # adds d[1]: 55 + 2 = 57, need 57 + 2048; removes a[1], d[2], abar[2]:
            # 57 - 2 - 4 - 32 = 19
            ({"a[0]", "abar[1]", "d[1]"}, 19, 2105),
            # B(0): 19 + 1 = 20, need 20 + 1024; removes a[0], d[1], abar[1]: 1
            ({"d[0]"}, 1, 1044),
        ],
    )
    assert t.peak_memory == 8225
    # 1 + 2 + 4 + 64.5 + 2 + 4 + 32 + 1 + 2 + 16 + 8
    assert t.makespan == 136.5


def test_f_n_with_both_inputs_removes_a_and_keeps_abar():
    ops = [F_all(0), F_ck(0), F_n(1), F_all(2), Loss(), B(2), F_all(1), B(1), B(0)]
    t = run(ops)
    check(
        t,
        [
            # F_all(0): 1 + 16 = 17, need 145
            ({"a[0]", "abar[1]"}, 17, 145),
            # F_ck(0): 17 + 2 = 19, need 19 + 128
            ({"a[0]", "a[1]", "abar[1]"}, 19, 147),
            # F_n(1): adds a[2]: 19 + 4 = 23, need 23 + 256; removes a[1] (not abar[1]):
            # 23 - 2 = 21
            ({"a[0]", "abar[1]", "a[2]"}, 21, 279),
            # F_all(2): adds abar[3]: 21 + 64 = 85, need 85 + 512
            ({"a[0]", "abar[1]", "a[2]", "abar[3]"}, 85, 597),
            # Loss: a[3] absent, abar[3] stays; adds d[3]: 85 + 8 = 93, need 93 + 8192
            ({"a[0]", "abar[1]", "a[2]", "abar[3]", "d[3]"}, 93, 8285),
            # B(2): adds d[2]: 97, need 97 + 4096; removes a[2], d[3], abar[3]: 97 - 76 = 21
            ({"a[0]", "abar[1]", "d[2]"}, 21, 4193),
            # F_all(1): reads abar[1]; adds abar[2]: 21 + 32 = 53, need 53 + 256
            ({"a[0]", "abar[1]", "abar[2]", "d[2]"}, 53, 309),
            # B(1): a[1] absent, abar[1] stays; adds d[1]: 55, need 55 + 2048;
            # removes d[2], abar[2]: 55 - 36 = 19
            ({"a[0]", "abar[1]", "d[1]"}, 19, 2103),
            ({"d[0]"}, 1, 1044),
        ],
    )
    # 1 + 1 + 2 + 4 + 64.5 + 32 + 2 + 16 + 8
    assert t.makespan == 130.5
    assert t.peak_memory == 8285


def test_loss_with_both_a_and_abar_frees_a_keeps_abar():
    ops = [F_all(0), F_all(1), F_all(2), F_ck(2), Loss(), B(2), B(1), B(0)]
    t = run(ops)
    check(
        t,
        [
            ({"a[0]", "abar[1]"}, 17, 145),
            ({"a[0]", "abar[1]", "abar[2]"}, 49, 305),
            ({"a[0]", "abar[1]", "abar[2]", "abar[3]"}, 113, 625),
            # F_ck(2): reads abar[2], adds a[3] next to abar[3]: 113 + 8 = 121, need 121 + 512
            ({"a[0]", "abar[1]", "abar[2]", "abar[3]", "a[3]"}, 121, 633),
            # Loss: adds d[3]: 121 + 8 = 129, need 129 + 8192; frees a[3]: 129 - 8 = 121
            ({"a[0]", "abar[1]", "abar[2]", "abar[3]", "d[3]"}, 121, 8321),
            # B(2): 121 + 4 = 125, need 125 + 4096; minus d[3], abar[3]: 125 - 72 = 53
            ({"a[0]", "abar[1]", "abar[2]", "d[2]"}, 53, 4221),
            ({"a[0]", "abar[1]", "d[1]"}, 19, 2103),
            ({"d[0]"}, 1, 1044),
        ],
    )
    # 1 + 2 + 4 + 4 + 64.5 + 32 + 16 + 8
    assert t.makespan == 131.5


def test_loss_uses_bwd_tmp_not_fwd_tmp_and_loss_only_chain():
    # L = 0: a[0] = 3 bytes, Loss reads a[0], adds d[0] (3): 6, need 6 + 7, frees a[0]
    c = Chain(
        fwd_time=[0.5], bwd_time=[2.0], in_size=[3], saved_size=[0], fwd_tmp=[100], bwd_tmp=[7]
    )
    t = run([Loss()], chain=c)
    assert t.buffers == (frozenset({"d[0]"}),)
    assert t.resident == (3,)
    assert t.op_peak == (13,)
    assert t.peak_memory == 13
    assert t.initial_memory == 3
    assert t.makespan == 2.5  # fwd_time[L] + bwd_time[L]


def test_peak_is_max_of_initial_and_op_needs():
    # All sizes zero except x0: a[0] alone is resident at the start (initial 5);
    # B(0) adds d[0] next to a[0]: need 5 + 5 = 10.
    c = Chain(
        fwd_time=[1.0, 0.0],
        bwd_time=[1.0, 1.0],
        in_size=[5, 0],
        saved_size=[0, 0],
        fwd_tmp=[0, 0],
        bwd_tmp=[0, 0],
    )
    t = run([F_all(0), Loss(), B(0)], chain=c)
    assert t.initial_memory == 5
    assert t.op_peak == (5, 5, 10)
    assert t.peak_memory == 10
    assert t.peak_memory == max(t.initial_memory, *t.op_peak)
    # with no sizes at all, the peak is the initial memory 0
    z = Chain(
        fwd_time=[1.0, 0.0],
        bwd_time=[1.0, 1.0],
        in_size=[0, 0],
        saved_size=[0, 0],
        fwd_tmp=[0, 0],
        bwd_tmp=[0, 0],
    )
    assert run([F_all(0), Loss(), B(0)], chain=z).peak_memory == 0


def test_docstring_example_and_input_forms():
    c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    # F_all(0): 4 + 12 = 16; Loss: 16 + 8 = 24; B(0): 24 + 4 = 28 (then 28 - 4 - 8 - 12 = 4)
    expected_peak, expected_time = 28, 1.0 + 0.5 + 2.0
    for ops in (
        [F_all(0), Loss(), B(0)],
        ["F_all(0)", "Loss()", "B(0)"],
        Schedule([F_all(0), Loss(), B(0)], meta={"method": "x"}),
        (op for op in [F_all(0), Loss(), B(0)]),
    ):
        t = schedir.simulate_chain(c, ops)
        assert t.peak_memory == expected_peak and t.makespan == expected_time
        assert t.resident == (16, 24, 4)
        assert t.buffers is None


def test_op_time():
    assert schedir.op_time(CHAIN, F_ck(1)) == 2.0
    assert schedir.op_time(CHAIN, F_n(2)) == 4.0
    assert schedir.op_time(CHAIN, F_all(0)) == 1.0
    assert schedir.op_time(CHAIN, B(1)) == 16.0
    assert schedir.op_time(CHAIN, Loss()) == 64.5


def test_simulate_unknown_problem():
    with pytest.raises(TypeError):
        simulate(object(), [Loss()])


# --- errors --------------------------------------------------------------------------


def error(ops, chain=CHAIN):
    with pytest.raises(InvalidSchedule) as err:
        simulate(chain, ops)
    return str(err.value)


def test_forward_missing_input():
    msg = error([F_ck(1)])
    assert "op 0" in msg and "F_ck(1)" in msg and "a[1]" in msg and "abar[1]" in msg
    msg = error([F_ck(0), F_n(2)])
    assert "op 1" in msg and "F_n(2)" in msg and "a[2]" in msg and "abar[2]" in msg
    msg = error([F_all(0), F_all(1), F_n(1), F_ck(1)])
    # F_n(1) read and dropped abar[1]
    assert "op 3" in msg and "F_ck(1)" in msg and "a[1]" in msg and "abar[1]" in msg


def test_f_n_zero_loses_a0_and_input_then_missing():
    # F_n(0) drops a[0] and nothing can recreate it: F_ck(0) then fails
    msg = error([F_n(0), F_ck(0)])
    assert "op 1" in msg and "F_ck(0)" in msg and "a[0]" in msg


def test_loss_missing_input():
    msg = error([F_ck(0), Loss()])
    assert "op 1" in msg and "Loss()" in msg and "a[3]" in msg and "abar[3]" in msg


def test_b_missing_gradient():
    msg = error([F_all(0), F_all(1), F_all(2), B(2)])
    assert "op 3" in msg and "B(2)" in msg and "d[3]" in msg


def test_b_missing_abar():
    msg = error([F_ck(0), F_ck(1), F_ck(2), Loss(), B(2)])
    assert "op 4" in msg and "B(2)" in msg and "abar[3]" in msg


def test_b_missing_input():
    # F_n(1) reads and drops abar[1]; at B(1) neither a[1] nor abar[1] is resident
    ops = [F_all(0), F_all(1), F_n(1), F_all(2), Loss(), B(2), B(1)]
    msg = error(ops)
    assert "op 6" in msg and "B(1)" in msg and "a[1]" in msg and "abar[1]" in msg


def test_b_before_loss_rejected():
    msg = error([F_all(0), F_all(1), F_all(2), B(0)])
    assert "op 3" in msg and "B(0)" in msg and "d[1]" in msg


@pytest.mark.parametrize(
    "ops, index, op, buf",
    [
        ([F_ck(0), F_ck(0)], 1, "F_ck(0)", "a[1]"),
        ([F_all(0), F_all(0)], 1, "F_all(0)", "abar[1]"),
        ([F_ck(0), F_ck(1), F_n(1)], 2, "F_n(1)", "a[2]"),
        ([F_ck(0), F_n(1), F_ck(0), F_ck(1)], 3, "F_ck(1)", "a[2]"),
        ([F_all(0), F_ck(1), F_all(2), Loss(), F_all(2)], 4, "F_all(2)", "abar[3]"),
    ],
)
def test_adding_resident_buffer_rejected(ops, index, op, buf):
    msg = error(ops)
    assert f"op {index}" in msg and op in msg and buf in msg and "already" in msg


@pytest.mark.parametrize(
    "ops, index",
    [
        # a[3] is resident, but stage 3 is the loss: F_ck(3) must be rejected
        ([F_ck(0), F_ck(1), F_ck(2), F_ck(3)], 3),
        ([F_ck(0), F_ck(1), F_ck(2), F_all(3)], 3),
        ([F_ck(0), F_ck(1), F_ck(2), F_n(3)], 3),
        ([F_all(0), F_all(1), F_all(2), Loss(), B(3)], 4),
        ([F_ck(7)], 0),
        ([B(9)], 0),
    ],
)
def test_out_of_range_stage_rejected(ops, index):
    msg = error(ops)
    assert f"op {index}" in msg and str(ops[index]) in msg and "range" in msg


@pytest.mark.parametrize(
    "ops, missing",
    [
        ([], ["Loss()", "B(2)", "B(1)", "B(0)"]),
        ([F_all(0), F_all(1), F_all(2)], ["Loss()", "B(2)", "B(1)", "B(0)"]),
        ([F_all(0), F_all(1), F_all(2), Loss()], ["B(2)", "B(1)", "B(0)"]),
        ([F_all(0), F_all(1), F_all(2), Loss(), B(2), B(1)], ["B(0)"]),
    ],
)
def test_incomplete_step_rejected(ops, missing):
    msg = error(ops)
    assert f"op {len(ops)}" in msg
    for name in missing:
        assert name in msg
    assert "d[0]" in msg


def test_duplicate_loss_rejected():
    msg = error([F_all(0), F_all(1), F_all(2), Loss(), Loss()])
    assert "op 4" in msg and "Loss()" in msg and "already" in msg


def test_duplicate_b_rejected():
    store_all = [F_all(0), F_all(1), F_all(2), Loss(), B(2), B(1), B(0)]
    msg = error(store_all + [B(0)])
    assert "op 7" in msg and "B(0)" in msg
    msg = error([F_all(0), F_all(1), F_all(2), Loss(), B(2), B(2)])
    assert "op 5" in msg and "B(2)" in msg and "d[3]" in msg
    # even after recomputing abar[3], a second B(2) lacks d[3]
    msg = error([F_all(0), F_all(1), F_all(2), Loss(), B(2), F_all(2), B(2)])
    assert "op 6" in msg and "B(2)" in msg


def test_extra_ops_after_completion_allowed_and_counted():
    # F_ck(0) after B(0) fails (B(0) freed a[0]) ...
    ops = [F_all(0), F_all(1), F_all(2), Loss(), B(2), B(1), B(0)]
    msg = error(ops + [F_ck(0)])
    assert "op 7" in msg and "a[0]" in msg
    # ... but a leftover buffer is fine: a[2] recomputed after B(2) is never freed
    ops = [F_all(0), F_all(1), F_all(2), Loss(), B(2), F_ck(1), B(1), B(0)]
    t = run(ops)
    # after B(2): a[0] + abar[1] + abar[2] + d[2] = 1 + 16 + 32 + 4 = 53
    # F_ck(1) reads abar[1], adds a[2]: 53 + 4 = 57, need 57 + 256
    # B(1): a[1] absent; adds d[1]: 59, need 59 + 2048; removes d[2], abar[2]: 59 - 36 = 23
    # B(0): adds d[0]: 24, need 24 + 1024; removes a[0], d[1], abar[1]: 24 - 19 = 5
    assert t.resident[-3:] == (57, 23, 5)
    assert t.op_peak[-3:] == (313, 2107, 1048)
    assert t.buffers[-1] == frozenset({"d[0]", "a[2]"})
