"""The copies of host-memory variants on the block chain's copy engines
(schedir/blocks/problem.py, "Its copies overlap compute"): hand-computed timelines of
a full overlap, a partial one, a copy longer than the compute it overlaps and two
copies queued on one engine; the bytes stay those of program order."""

from __future__ import annotations

import pytest

from schedir import B, F_all, InvalidProblem, Loss
from schedir.blocks.problem import BlockChain, BlockOption, BlockStage
from schedir.blocks.schedule import BlockSchedule
from schedir.blocks.simulate import simulate_blocks

OPS = [F_all(0), F_all(1), Loss(), B(1), B(0)]


def variant(copy_out: float, copy_back: float) -> BlockOption:
    """1 s of recording compute and 2 s of backward compute, its copies on top; 6
    bytes in host memory."""
    return BlockOption("v", 4, 1.0 + copy_out, 3 + 6, 2.0 + copy_back, 7, 0, 6,
                       copy_out=copy_out, copy_back=copy_back)  # fmt: skip


def chain(first: BlockOption, second: BlockOption | None = None) -> BlockChain:
    plain = BlockOption("keep", 5, 1.0, 0, 2.0, 0)
    stages = (
        BlockStage("s0", 1.0, 0, (), (first,)),
        BlockStage("s1", 1.0, 0, (1,), (second or plain,)),
    )
    return BlockChain((10, 10, 10), (10, 10, 10), ((), (1,), (2,)), stages, 1.0, 0)


def timeline(problem: BlockChain):
    return simulate_blocks(problem, BlockSchedule(OPS, {}, [0, 0]))


@pytest.mark.parametrize(
    ("copy_out", "copy_back", "starts", "makespan"),
    [
        # compute: F_all(0) [0, 1], F_all(1) [1, 2], Loss [2, 3], B(1) [3, 5]; the
        # copy-out runs from 1, the copy-back is issued when B(1) starts (3)
        (1.0, 1.0, (0, 1, 2, 3, 5), 7.0),  # out [1, 2], back [3, 4]: all hidden
        (1.0, 3.0, (0, 1, 2, 3, 6), 8.0),  # back [3, 6]: B(0) waits 1 s
        (4.0, 1.0, (0, 1, 2, 3, 6), 8.0),  # out [1, 5] outlasts 2 s of compute; back [5, 6]
    ],
)
def test_copies_overlap_compute_by_hand(copy_out, copy_back, starts, makespan):
    t = timeline(chain(variant(copy_out, copy_back)))
    assert t.start == starts and t.makespan == makespan
    assert t.end[-1] == makespan and t.end[0] == 1.0  # the recording's compute alone
    assert t.serial_makespan == 7.0 + copy_out + copy_back  # charged whole: the DP's
    assert t.makespan <= t.serial_makespan


def test_one_engine_per_direction():
    """Both recordings copy out for 3 s each: the second waits for the engine."""
    t = timeline(chain(variant(3.0, 1.0), variant(3.0, 1.0)))
    # outs [1, 4] and [4, 7]; B(1)'s back issued at the loss's start (2), after its
    # copy-out: [7, 8]; B(0)'s at B(1)'s start (8): [8, 9]
    assert t.start == (0, 1, 2, 8, 10) and t.makespan == 12.0
    assert t.serial_makespan == 15.0


def test_bytes_are_program_order_and_no_copy_changes_nothing():
    """Copies move time only: the bytes are those the op-by-op runtime measures; an
    option without copies has the same timeline as before they existed."""
    t, serial = timeline(chain(variant(4.0, 3.0))), timeline(chain(variant(0.0, 0.0)))
    assert (t.resident, t.op_peak, t.host_resident) == (
        serial.resident, serial.op_peak, serial.host_resident)  # fmt: skip
    assert serial.makespan == serial.serial_makespan == 7.0
    assert serial.start == (0, 1, 2, 3, 5)


def test_copies_are_checked():
    with pytest.raises(InvalidProblem, match=r"option 'x'.copy_out = 2.0: a part of its rec_time"):
        BlockOption("x", 0, 1.0, 0, 1.0, 0, 0, 4, copy_out=2.0)
    with pytest.raises(InvalidProblem, match=r"option 'x'.copy_back = 0.5: it copies nothing"):
        BlockOption("x", 0, 1.0, 0, 1.0, 0, copy_back=0.5)
    with pytest.raises(InvalidProblem, match=r"option 'x'.copy_out = -1"):
        BlockOption("x", 0, 1.0, 0, 1.0, 0, 0, 4, copy_out=-1)
    p = chain(variant(1.0, 2.0))
    assert BlockChain.from_dict(p.to_dict()) == p


def test_compute_only_hides_the_copies():
    """The DP's other bound: the same chain with the copies' time left out."""
    p = chain(variant(1.0, 3.0))
    q = p.compute_only()
    option = q.stages[0].options[0]
    assert (option.rec_time, option.bwd_time, option.copy_out, option.copy_back) == (1, 2, 0, 0)
    t, hidden = timeline(p), timeline(q)
    assert hidden.makespan == hidden.serial_makespan == 7.0 <= t.makespan
    assert (hidden.resident, hidden.op_peak, hidden.host_resident) == (
        t.resident, t.op_peak, t.host_resident)  # fmt: skip
    assert chain(variant(0.0, 0.0)).compute_only() == chain(variant(0.0, 0.0))
