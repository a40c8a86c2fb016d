"""Property tests of the chain simulator and the JSON formats.

``ref_simulate`` below is an independent reference simulator written straight from the
op table of docs/semantics.md (plus the documented choice that ``Loss`` frees ``a[L]``
if present), and ``valid_schedules`` draws random valid training steps by a random walk
over the ops that are valid in the current state.
"""

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedir
from schedir import B, Chain, F_all, F_ck, F_n, InvalidSchedule, Loss, Schedule

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- independent reference simulator -------------------------------------------------


class RejectedError(Exception):
    pass


def buffer_size(chain, buf):
    kind, k = buf
    if kind == "abar":
        return chain.saved_size[k - 1]  # abar[k] = a_k + residuals of stage k - 1
    return chain.in_size[k] if k <= chain.length else 0  # a[k], d[k]: x_k


def ref_step(chain, mem, done, op):
    """Apply ``op`` to the resident set ``mem`` (and the set ``done`` of finished
    backwards, L standing for the loss). Return the memory the op needs; raise
    RejectedError when the op cannot run."""
    L = chain.length

    def source(k):  # the input an op reads: a[k] if resident, else abar[k]
        if ("a", k) in mem:
            return ("a", k)
        if ("abar", k) in mem:
            return ("abar", k)
        raise RejectedError(f"{op}: no a[{k}] / abar[{k}]")

    def add(buf):
        if buf in mem:
            raise RejectedError(f"{op}: {buf} already resident")
        mem.add(buf)

    def used():
        return sum(buffer_size(chain, b) for b in mem)

    if isinstance(op, Loss):
        if L in done:
            raise RejectedError("second Loss")
        source(L)
        add(("d", L))
        need = used() + chain.bwd_tmp[L]
        mem.discard(("a", L))  # frees a[L] if present; abar[L] stays
        done.add(L)
        return need
    k = op.index
    if not 0 <= k < L:
        raise RejectedError(f"{op}: stage out of range")
    if isinstance(op, B):
        if k in done:
            raise RejectedError(f"second {op}")
        if ("d", k + 1) not in mem or ("abar", k + 1) not in mem:
            raise RejectedError(f"{op}: needs d[{k + 1}] and abar[{k + 1}]")
        source(k)
        add(("d", k))
        need = used() + chain.bwd_tmp[k]
        mem.discard(("a", k))  # else abar[k] stays
        mem.remove(("d", k + 1))
        mem.remove(("abar", k + 1))
        done.add(k)
        return need
    src = source(k)
    add(("abar", k + 1) if isinstance(op, F_all) else ("a", k + 1))
    need = used() + chain.fwd_tmp[k]
    if isinstance(op, F_n):
        mem.remove(src)
    return need


def ref_time(chain, op):
    if isinstance(op, Loss):
        return chain.fwd_time[chain.length] + chain.bwd_time[chain.length]
    if isinstance(op, B):
        return chain.bwd_time[op.index]
    return chain.fwd_time[op.index]


def ref_simulate(chain, ops):
    """(makespan, peak, resident bytes after each op, need of each op), or RejectedError."""
    mem, done = {("a", 0)}, set()
    peak = buffer_size(chain, ("a", 0))
    resident, needs = [], []
    for op in ops:
        need = ref_step(chain, mem, done, op)
        needs.append(need)
        resident.append(sum(buffer_size(chain, b) for b in mem))
        peak = max(peak, need)
    if done != set(range(chain.length + 1)):
        raise RejectedError("incomplete step")
    assert ("d", 0) in mem
    return math.fsum(ref_time(chain, op) for op in ops), peak, resident, needs


# --- strategies ----------------------------------------------------------------------

sizes = st.integers(0, 1000) | st.integers(0, 10**9)
times = st.floats(0, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def chains(draw, min_length=1, max_length=6):
    L = draw(st.integers(min_length, max_length))
    n = L + 1
    loss_fwd = draw(st.just(0.0) | times)
    return Chain(
        fwd_time=draw(st.lists(times, min_size=L, max_size=L)) + [loss_fwd],
        bwd_time=draw(st.lists(times, min_size=n, max_size=n)),
        in_size=draw(st.lists(sizes, min_size=n, max_size=n)),
        saved_size=draw(st.lists(sizes, min_size=L, max_size=L)) + [0],
        fwd_tmp=draw(st.lists(sizes, min_size=L, max_size=L)) + [0],
        bwd_tmp=draw(st.lists(sizes, min_size=n, max_size=n)),
    )


def all_ops(L):
    ops = [cls(k) for k in range(L) for cls in (F_ck, F_n, F_all, B)]
    return ops + [Loss()]


def progress_op(L, mem, done):
    """Next op of a greedy completion (valid whenever a[0] is resident)."""
    t = min(done) if done else L + 1  # the next backward to run is that of stage t - 1

    def has(k):
        return ("a", k) in mem or ("abar", k) in mem

    top = L if t == L + 1 else t - 1  # the stage whose input must be resident
    if not has(top):
        s = max(k for k in range(top) if has(k))
        return F_ck(s)
    if t == L + 1:
        return Loss()
    if ("abar", t) not in mem:
        return F_all(t - 1)
    return B(t - 1)


def is_valid(chain, mem, done, op):
    try:
        ref_step(chain, set(mem), set(done), op)
    except RejectedError:
        return False
    return True


@st.composite
def valid_ops(draw, chain):
    """A random valid training step: a random walk over the valid ops (never F_n(0),
    which drops a[0] for good and makes B(0) impossible), biased toward progress,
    finished by the greedy completion."""
    L = chain.length
    mem, done = {("a", 0)}, set()
    ops = []
    walk = draw(st.integers(0, 6 * L + 6))
    candidates = [op for op in all_ops(L) if op != F_n(0)]
    while len(done) < L + 1:
        if len(ops) < walk and draw(st.integers(0, 3)) > 0:
            valid = [op for op in candidates if is_valid(chain, mem, done, op)]
            op = draw(st.sampled_from(valid))
        else:
            op = progress_op(L, mem, done)
        ref_step(chain, mem, done, op)
        ops.append(op)
        assert len(ops) < 1000
    return ops


@st.composite
def chain_and_ops(draw):
    chain = draw(chains())
    return chain, draw(valid_ops(chain))


@st.composite
def random_op(draw, L):
    kind = draw(st.sampled_from([F_ck, F_n, F_all, B, Loss]))
    if kind is Loss:
        return Loss()
    return kind(draw(st.integers(0, L + 1)))


@st.composite
def mutated(draw):
    chain, ops = draw(chain_and_ops())
    ops = list(ops)
    L = chain.length
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["drop", "dup", "swap", "insert", "replace"]))
        if not ops:
            what = "insert"
        i = draw(st.integers(0, len(ops) - 1)) if ops else 0
        if what == "drop":
            del ops[i]
        elif what == "dup":
            ops.insert(i, ops[i])
        elif what == "swap":
            j = draw(st.integers(0, len(ops) - 1))
            ops[i], ops[j] = ops[j], ops[i]
        elif what == "insert":
            ops.insert(i, draw(random_op(L)))
        else:
            ops[i] = draw(random_op(L))
    return chain, ops


# --- properties of valid schedules ---------------------------------------------------


@SETTINGS
@given(chain_and_ops())
def test_valid_schedule_trace_invariants(case):
    chain, ops = case
    t = schedir.simulate(chain, ops, record_buffers=True)
    assert len(t.resident) == len(t.op_peak) == len(ops)
    assert t.initial_memory == chain.in_size[0]
    assert all(t.peak_memory >= r for r in t.resident)
    assert all(t.peak_memory >= n for n in t.op_peak)
    assert t.peak_memory == max(t.initial_memory, *t.op_peak)
    # an op's need counts what is resident after it at least for forwards (nothing freed
    # before the output is added) and never goes below the resident bytes
    for op, r, n in zip(ops, t.resident, t.op_peak, strict=True):
        if isinstance(op, F_ck | F_all):
            assert n == r + chain.fwd_tmp[op.index]
    op_times = []
    for op in ops:
        if isinstance(op, Loss):
            op_times.append(chain.fwd_time[-1] + chain.bwd_time[-1])
        elif isinstance(op, B):
            op_times.append(chain.bwd_time[op.index])
        else:
            op_times.append(chain.fwd_time[op.index])
    assert math.isclose(t.makespan, math.fsum(op_times), rel_tol=1e-12, abs_tol=1e-300)
    assert t.end[-1] == t.makespan and t.start[0] == 0.0
    assert "d[0]" in t.buffers[-1]
    assert t.resident[-1] >= chain.in_size[0]
    assert sum(isinstance(op, Loss) for op in ops) == 1
    assert sorted(op.index for op in ops if isinstance(op, B)) == list(range(chain.length))


@SETTINGS
@given(chain_and_ops())
def test_agrees_with_reference_on_valid_schedules(case):
    chain, ops = case
    makespan, peak, resident, needs = ref_simulate(chain, ops)
    t = schedir.simulate(chain, ops)
    assert math.isclose(t.makespan, makespan, rel_tol=1e-9, abs_tol=1e-300)
    assert t.peak_memory == peak
    assert list(t.resident) == resident
    assert list(t.op_peak) == needs


@SETTINGS
@given(mutated())
def test_agrees_with_reference_on_mutated_schedules(case):
    chain, ops = case
    try:
        expected = ref_simulate(chain, ops)
    except RejectedError:
        expected = None
    try:
        t = schedir.simulate(chain, ops)
    except InvalidSchedule:
        t = None
    if expected is None:
        assert t is None, f"schedir accepted {ops}"
        return
    assert t is not None, f"schedir rejected {ops}"
    makespan, peak, resident, needs = expected
    assert math.isclose(t.makespan, makespan, rel_tol=1e-9, abs_tol=1e-300)
    assert t.peak_memory == peak
    assert list(t.resident) == resident
    assert list(t.op_peak) == needs


@SETTINGS
@given(chains(), st.lists(st.integers(0, 10**6), max_size=40))
def test_agrees_with_reference_on_random_sequences(chain, picks):
    L = chain.length
    ops_pool = all_ops(L) + [F_ck(L), B(L), F_all(L + 1)]
    ops = [ops_pool[p % len(ops_pool)] for p in picks]
    try:
        expected = ref_simulate(chain, ops)
    except RejectedError:
        expected = None
    try:
        t = schedir.simulate(chain, ops)
    except InvalidSchedule:
        t = None
    assert (t is None) == (expected is None)
    if t is not None:
        assert (t.peak_memory, list(t.resident)) == (expected[1], expected[2])


# --- JSON round trips ----------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@SETTINGS
@given(chains(min_length=0))
def test_chain_json_round_trip(chain):
    text = json.dumps(chain.to_dict())
    back = schedir.from_dict(json.loads(text))
    assert back == chain
    assert Chain.from_dict(json.loads(text)) == chain


@SETTINGS
@given(
    chains(max_length=5).flatmap(lambda c: valid_ops(c)),
    # any JSON but "budget", which a Schedule checks (a whole number of bytes or None;
    # hypothesis draws the string constants of the code under test, that one included)
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "budget"), json_values, max_size=5),
    st.none() | st.integers(0, 2**40),
)
def test_schedule_json_round_trip(ops, meta, budget):
    meta = meta if budget is None else {**meta, "budget": budget}
    s = Schedule(ops, meta=meta)
    back = Schedule.from_json(s.to_json())
    assert back == s
    assert back.ops == tuple(ops)
    assert back.meta == meta
    assert schedir.from_dict(json.loads(s.to_json())) == s


@SETTINGS
@given(st.lists(st.integers(0, 10**6), max_size=20))
def test_ops_parse_round_trip(indices):
    for k in indices:
        for cls in (F_ck, F_n, F_all, B):
            op = cls(k)
            assert schedir.parse_op(str(op)) == op
