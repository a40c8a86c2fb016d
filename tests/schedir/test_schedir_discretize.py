"""Bytes to memory slots (docs/semantics.md, discretization)."""

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedir import B, Chain, F_all, F_ck, InvalidProblem, Loss, discretize, simulate

SIZE_FIELDS = ("in_size", "saved_size", "fwd_tmp", "bwd_tmp")


def test_docstring_example():
    c = Chain.from_rotor([1.0], [1.0, 1.0], [1000, 999], [0, 1999], [0], [0, 10])
    d = discretize(c, budget=5000, slots=50)
    # slot = ceil(5000 / 50) = 100; 1000 -> 10, 999 -> ceil(9.99) = 10, 1999 -> 20,
    # 10 -> ceil(0.1) = 1; budget 5000 // 100 = 50
    assert d.slot_size == 100
    assert d.budget == 50
    assert d.chain.in_size == (10, 10)
    assert d.chain.saved_size == (20, 0)
    assert d.chain.bwd_tmp == (0, 1)
    assert d.chain.fwd_tmp == (0, 0)


def small_chain():
    return Chain(
        fwd_time=[1.5, 2.5, 0.0],
        bwd_time=[3.0, 4.0, 5.0],
        in_size=[0, 1, 101],
        saved_size=[102, 1000, 0],
        fwd_tmp=[100, 202, 0],
        bwd_tmp=[203, 1010, 7],
        names=["s0", "s1", "loss"],
    )


def test_round_up_uneven_budget():
    d = discretize(small_chain(), budget=1001, slots=10)
    # slot = ceil(1001 / 10) = ceil(100.1) = 101
    assert d.slot_size == 101
    # budget rounds down: 1001 // 101 = 9 (9 * 101 = 909 <= 1001 < 1010)
    assert d.budget == 9
    # sizes round up: 0 -> 0, 1 -> 1, 101 -> 1, 102 -> 2, 1000 -> ceil(9.9) = 10,
    # 100 -> 1, 202 -> 2, 203 -> ceil(2.01) = 3, 1010 -> 10, 7 -> 1
    assert d.chain.in_size == (0, 1, 1)
    assert d.chain.saved_size == (2, 10, 0)
    assert d.chain.fwd_tmp == (1, 2, 0)
    assert d.chain.bwd_tmp == (3, 10, 1)
    # times and names are untouched
    assert d.chain.fwd_time == (1.5, 2.5, 0.0)
    assert d.chain.bwd_time == (3.0, 4.0, 5.0)
    assert d.chain.names == ("s0", "s1", "loss")


def test_round_down_relaxation():
    d = discretize(small_chain(), budget=1001, slots=10, round_up=False)
    assert d.slot_size == 101
    # budget rounds up: ceil(1001 / 101) = 10
    assert d.budget == 10
    # sizes round down: 0, 1 -> 0, 101 -> 1, 102 -> 1, 1000 -> 9, 100 -> 0, 202 -> 2,
    # 203 -> 2, 1010 -> 10, 7 -> 0
    assert d.chain.in_size == (0, 0, 1)
    assert d.chain.saved_size == (1, 9, 0)
    assert d.chain.fwd_tmp == (0, 2, 0)
    assert d.chain.bwd_tmp == (2, 10, 0)


def test_exact_division_and_default_slots():
    d = discretize(small_chain(), budget=1000)  # slots = 500: slot = 2
    assert d.slot_size == 2 and d.budget == 500
    assert d.chain.in_size == (0, 1, 51)  # 1 -> ceil(0.5) = 1, 101 -> ceil(50.5) = 51
    d = discretize(small_chain(), budget=7, slots=100)  # more slots than bytes: slot = 1
    assert d.slot_size == 1 and d.budget == 7
    assert d.chain.saved_size == (102, 1000, 0)


def test_input_chain_unchanged():
    c = small_chain()
    discretize(c, budget=1001, slots=10)
    assert c == small_chain()


@pytest.mark.parametrize("budget", [-5, 1.5, 100.0, True, None, "100"])
def test_bad_budget(budget):
    with pytest.raises(InvalidProblem, match="budget"):
        discretize(small_chain(), budget=budget, slots=10)


@pytest.mark.parametrize("slots", [0, -1, 2.5, 10.0, True, None])
def test_bad_slots(slots):
    with pytest.raises(InvalidProblem, match="slots"):
        discretize(small_chain(), budget=1000, slots=slots)


# --- properties ----------------------------------------------------------------------

SETTINGS = settings(max_examples=200, deadline=None)
sizes = st.integers(0, 5000) | st.integers(0, 10**9)
times = st.floats(0, 100, allow_nan=False)


@st.composite
def chain_and_ops(draw):
    """A random chain and a valid schedule: for each stage, record its forward at once
    (F_all) or keep only a[k+1] (F_ck) and record it again before its backward."""
    L = draw(st.integers(1, 6))
    n = L + 1
    chain = Chain(
        fwd_time=draw(st.lists(times, min_size=L, max_size=L)) + [0.0],
        bwd_time=draw(st.lists(times, min_size=n, max_size=n)),
        in_size=draw(st.lists(sizes, min_size=n, max_size=n)),
        saved_size=draw(st.lists(sizes, min_size=L, max_size=L)) + [0],
        fwd_tmp=draw(st.lists(sizes, min_size=L, max_size=L)) + [0],
        bwd_tmp=draw(st.lists(sizes, min_size=n, max_size=n)),
    )
    record = draw(st.lists(st.booleans(), min_size=L, max_size=L))
    ops = [F_all(k) if record[k] else F_ck(k) for k in range(L)] + [Loss()]
    for k in range(L - 1, -1, -1):
        if not record[k]:
            ops.append(F_all(k))
        ops.append(B(k))
    return chain, ops


def draw_budget(draw, chain, ops):
    byte_peak = simulate(chain, ops).peak_memory
    budget = draw(st.integers(max(1, byte_peak // 2), 2 * byte_peak + 2))
    slots = draw(st.integers(1, 600))
    return byte_peak, budget, slots


@SETTINGS
@given(chain_and_ops(), st.data())
def test_round_up_is_safe(case, data):
    chain, ops = case
    byte_peak, budget, slots = draw_budget(data.draw, chain, ops)
    d = discretize(chain, budget, slots)
    s = d.slot_size
    assert s == math.ceil(Fraction(budget, slots))
    # budget rounds down
    assert d.budget * s <= budget < (d.budget + 1) * s
    # sizes round up, never down, and by less than one slot
    for name in SIZE_FIELDS:
        for v, v_slots in zip(getattr(chain, name), getattr(d.chain, name), strict=True):
            assert v_slots * s >= v
            assert (v_slots - 1) * s < v or v_slots == 0
    # feasible in slots implies feasible in bytes
    slot_trace = simulate(d.chain, ops)
    assert byte_peak <= slot_trace.peak_memory * s
    if slot_trace.peak_memory <= d.budget:
        assert byte_peak <= budget
    # discretization does not change times
    assert slot_trace.makespan == simulate(chain, ops).makespan


@SETTINGS
@given(chain_and_ops(), st.data())
def test_round_down_is_a_relaxation(case, data):
    chain, ops = case
    byte_peak, budget, slots = draw_budget(data.draw, chain, ops)
    d = discretize(chain, budget, slots, round_up=False)
    s = d.slot_size
    assert s == math.ceil(Fraction(budget, slots))
    assert (d.budget - 1) * s < budget <= d.budget * s
    for name in SIZE_FIELDS:
        for v, v_slots in zip(getattr(chain, name), getattr(d.chain, name), strict=True):
            assert v_slots * s <= v < (v_slots + 1) * s
    slot_peak = simulate(d.chain, ops).peak_memory
    assert slot_peak * s <= byte_peak
    if byte_peak <= budget:
        assert slot_peak <= d.budget


@SETTINGS
@given(chain_and_ops(), st.integers(1, 10**12), st.integers(1, 10**4))
def test_slot_budget_close_to_requested_slots(case, budget, slots):
    chain, _ = case
    d = discretize(chain, budget, slots)
    assert d.slot_size >= 1
    assert d.budget <= slots
    # the slot grid never loses more than one slot's worth of budget
    assert budget - d.budget * d.slot_size < d.slot_size


def test_size_unit_makes_the_discretization_exact():
    from schedir.chain.discretize import size_unit

    c = Chain.from_rotor([1.0], [1.0, 1.0], [4_000_000, 2_000_000], [0, 6_000_000], [0], [0, 0])
    assert size_unit(c) == 2_000_000
    for round_up in (True, False):
        d = discretize(c, 9_999_999, slot_size=size_unit(c), round_up=round_up)
        assert d.chain.in_size == (2, 1) and d.chain.saved_size == (3, 0)
    assert discretize(c, 9_999_999, slot_size=2_000_000).budget == 4  # floor: 8 MB fit
    assert discretize(c, 0, slot_size=7).budget == 0  # a zero budget has zero slots
    zeros = Chain.from_rotor([1.0], [1.0, 1.0], [0, 0], [0, 0], [0], [0, 0])
    assert size_unit(zeros) == 1
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InvalidProblem, match="slot_size"):
            discretize(c, 100, slot_size=bad)
    with pytest.raises(InvalidProblem, match="budget = 0"):
        discretize(c, 0, slots=10)
