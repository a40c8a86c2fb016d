"""The chain simulator: the judge of every chain schedule (docs/semantics.md, the op table).

Memory holds named buffers ``a[k]`` (x_k bytes), ``abar[k]`` (s_{k-1} bytes: a_k and the
residuals of the stage that produced it) and ``d[k]`` (x_k bytes). Execution starts
with ``a[0]`` resident. The memory an op needs is the sum of the resident buffers
right after it adds its output, plus its temporary bytes; peak memory is the maximum
of that over the ops and of the initial state. Makespan is the sum of the op times.
What each op reads, adds and frees is :func:`schedir.chain.ops.effect`.

One choice the chain model leaves open is made there and documented in
``docs/semantics.md``: ``Loss`` behaves like the backward of stage L, so it frees
``a[L]`` if present (``abar[L]``, needed by ``B(L-1)``, stays). Without this the exact
DP of section 3.2 would not be realizable.
"""

from __future__ import annotations

from collections.abc import Iterable

from schedir.chain.ops import (
    B,
    Buffer,
    Loss,
    buffer_name,
    check_complete_step,
    effect,
    op_time,
)
from schedir.chain.problem import Chain
from schedir.chain.schedule import Schedule, as_ops
from schedir.errors import InvalidSchedule
from schedir.trace import Span, Trace, TraceRecorder

__all__ = ["Trace", "buffer_name", "chain_lanes", "op_time", "simulate_chain"]


def simulate_chain(
    chain: Chain, schedule_or_ops: Schedule | Iterable, *, record_buffers: bool = False
) -> Trace:
    """Run ``schedule_or_ops`` on ``chain`` and return its :class:`Trace`.

    Raises :class:`InvalidSchedule` naming the op index, the op and the missing buffer
    when an op cannot run, and when the sequence is not a complete training step
    (Loss and every ``B(k)`` exactly once, ending with ``d[0]``).

    >>> from schedir import Chain, F_all, Loss, B
    >>> c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    >>> t = simulate_chain(c, [F_all(0), Loss(), B(0)])
    >>> t.makespan, t.peak_memory
    (3.5, 28)
    """
    ops = as_ops(schedule_or_ops)
    L = chain.length
    x = chain.in_size + (0,)

    size: dict[Buffer, int] = {("a", k): x[k] for k in range(L + 1)}
    size.update({("d", k): x[k] for k in range(L + 1)})
    size.update({("abar", k): chain.saved_size[k - 1] for k in range(1, L + 1)})

    resident: set[Buffer] = {("a", 0)}
    total = x[0]
    backward_done = [False] * (L + 1)  # index L is the loss
    recorder = TraceRecorder(total, record_buffers)
    for i, op in enumerate(ops):
        try:
            eff = effect(chain, op, resident)
        except InvalidSchedule as err:
            raise InvalidSchedule(f"op {i}: {op}: {err}") from None
        done = L if type(op) is Loss else op.index if type(op) is B else None
        if done is not None and backward_done[done]:
            what = "the loss" if done == L else f"B({done})"
            raise InvalidSchedule(
                f"op {i}: {op}: {what} already ran (every backward runs exactly once)"
            )
        for buf in eff.adds:
            if buf in resident:
                raise InvalidSchedule(f"op {i}: {op}: {buffer_name(buf)} is already resident")
            resident.add(buf)
            total += size[buf]
        need = total + eff.tmp
        for buf in eff.frees:
            resident.remove(buf)
            total -= size[buf]
        if done is not None:
            backward_done[done] = True
        recorder.record(need, total, eff.time, lambda: map(buffer_name, resident))

    check_complete_step(backward_done, len(ops))
    return recorder.trace(ops)


def chain_lanes(problem, schedule, trace) -> dict:
    """One ``compute`` lane; kind = the op's class name (F_ck, F_n, F_all, Loss, B)."""
    spans = [
        Span(s, e, str(op), type(op).__name__)
        for op, s, e in zip(trace.ops, trace.start, trace.end, strict=True)
    ]
    return {"compute": spans}
