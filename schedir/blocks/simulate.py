"""The judge of block-chain schedules: :func:`simulate_blocks` runs a schedule on a
:class:`~schedir.blocks.problem.BlockChain` and gives its memory after every op and its
times, the figures the op-by-op runtime measures (docs/auto.md, "The block chain").

Memory needed by an op = bytes of the union of the resident buffers right after it
adds its output, plus its temporary bytes (plain forwards ``fwd_tmp``, recording
forwards the option's ``rec_tmp``, backwards its ``bwd_tmp`` minus its
``bwd_release``, the loss ``loss_tmp``).

**A host-memory variant's copies overlap compute.** ``copy_out`` seconds of its
``rec_time`` and ``copy_back`` of its ``bwd_time`` are its copies
(:class:`~schedir.blocks.problem.BlockOption`). The times a
schedule's ops sum to (``Trace.serial_makespan``) charge them whole, what the block DP
minimizes; ``Trace.makespan`` runs them on the copy engines
(:class:`~schedir.offload.engines.CopyEngines`, the offload simulator's rule): the
copy-out starts when the recording's compute ends and runs beside the ops after it;
the copy-back is issued when the compute op before the backward starts (one op
ahead, as a ``Prefetch`` placed before it), once the copy-out is done, and the
backward starts when it is complete (waiting only for what is left). The bytes stay
those of program order, what the op-by-op runtime (which has no concurrency) measures
after every op: the residuals leave the device when the recording ends and come back
in the backward; on a device that overlaps, each copy's device buffer lives from its
start to its end, up to those bytes more during the ops it overlaps.
"""

from __future__ import annotations

import dataclasses

from schedir.blocks.problem import BlockChain
from schedir.chain.ops import B, F_all, Loss, buffer_moves, check_complete_step
from schedir.chain.schedule import as_ops
from schedir.chain.simulate import chain_lanes
from schedir.errors import InvalidSchedule
from schedir.offload.effects import CopyStates
from schedir.offload.engines import CopyEngines
from schedir.offload.ops import Evict, Offload, Prefetch, Wait
from schedir.trace import Span, Trace, TraceRecorder


def schedule_options(problem: BlockChain, schedule: object) -> tuple[int, ...]:
    """The option indices a schedule uses (a :class:`BlockSchedule`'s ``options``),
    checked against ``problem``."""
    from schedir.blocks.schedule import BlockSchedule

    if not isinstance(schedule, BlockSchedule):
        raise InvalidSchedule(
            f"a block-chain schedule is a BlockSchedule naming one option per stage, got "
            f"{type(schedule).__name__}"
        )
    return problem.check_options(schedule.options)


def simulate_blocks(problem: BlockChain, schedule_or_ops, *, record_buffers: bool = False) -> Trace:
    """Run a schedule on a :class:`BlockChain` (module docstring); a chain ``Trace``.

    The schedule may hold copy ops (an ``OffloadSchedule``: ``Offload``, ``Prefetch``,
    ``Wait`` on ``a``, ``abar`` and ``d`` buffers), with the rules of
    :mod:`schedir.offload.effects` in program order: a buffer counts on the device
    from its ``Prefetch`` until its ``Wait`` after an ``Offload``, and its host copy in
    ``host_resident`` (these copies take no time here: the offload simulator times
    them). An option's ``host`` bytes count in ``host_resident`` while its recording
    is held, and its copies run on the copy engines (module docstring: ``makespan``
    overlaps them, ``serial_makespan`` charges them whole).

    Raises :class:`InvalidSchedule` naming the op, as the chain simulator does, and
    when the schedule is not a :class:`BlockSchedule` of valid options.
    """
    opts = schedule_options(problem, schedule_or_ops)
    ops = as_ops(schedule_or_ops)
    L = problem.length
    vsize, gsize = problem.value_sizes, problem.grad_sizes

    def members(buf: tuple[str, int]) -> frozenset:
        kind, c = buf
        if kind == "d":
            return frozenset(("d", v, r) for v, r in problem.grad_ids(c))
        base = frozenset(("v", v) for v in problem.cuts[c])
        if kind != "abar":
            return base
        late = problem.stages[c - 1].options[opts[c - 1]].host > 0
        return base | {("s", c - 1)} | ({("h", c - 1)} if late else set())

    def nbytes(item: tuple) -> int:
        if item[0] == "v":
            return vsize[item[1]]
        if item[0] == "d":
            return gsize[item[1]]
        option = problem.stages[item[1]].options[opts[item[1]]]
        return option.saved if item[0] == "s" else option.host

    resident: dict[tuple[str, int], frozenset] = {("a", 0): members(("a", 0))}
    host: dict[tuple[str, int], frozenset] = {}
    states = CopyStates({("a", 0): "dev"})
    done = [False] * (L + 1)

    class Bytes(dict):  # item -> nbytes(item), each computed once (summed in C below)
        def __init__(self, device: bool) -> None:
            super().__init__()
            self.device = device  # residuals kept on the host ("h") count 0 on the device

        def __missing__(self, item: tuple) -> int:
            self[item] = 0 if self.device and item[0] == "h" else nbytes(item)
            return self[item]

    size, on_device = Bytes(device=False), Bytes(device=True)

    def total(held: dict) -> int:  # device bytes
        live = set().union(*held.values()) if held else set()
        return sum(map(on_device.__getitem__, live))

    def host_total() -> int:  # copies of offloaded buffers and held host residuals, once
        late = {i for held in resident.values() for i in held if i[0] == "h"}
        return sum(map(size.__getitem__, late.union(*host.values())))

    def fail(i: int, op, why: str) -> InvalidSchedule:
        return InvalidSchedule(f"op {i}: {op}: {why}")

    recorder = TraceRecorder(total(resident), record_buffers)
    host_after: list[int] = []
    copies = _CopyStream()
    for i, op in enumerate(ops):
        if isinstance(op, Offload | Prefetch | Wait | Evict):
            buf = op.key
            if buf[0] not in ("a", "abar", "d") or not 0 <= buf[1] <= L:
                raise fail(i, op, f"{op.buffer} is not a buffer of this block chain")
            try:
                change = states.effect(op)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            if change.host_add:
                host[buf] = resident[buf]
            if change.device_drop:
                del resident[buf]
            if change.device_add:
                resident[buf] = host[buf]
            if change.host_drop:
                del host[buf]
            now = total(resident)
            recorder.record(now, now, 0.0, lambda: (f"{b[0]}[{b[1]}]" for b in resident))
            host_after.append(host_total())
            continue
        try:  # the chain's op table; the costs are the block options'
            reads, adds, frees = buffer_moves(op, L, resident)
            for change in states.reads(reads):
                del host[change.buffer]
        except InvalidSchedule as err:
            raise fail(i, op, str(err)) from None
        k = L if isinstance(op, Loss) else op.index
        if isinstance(op, Loss | B) and done[k]:
            what = "the loss" if k == L else f"B({k})"
            raise fail(i, op, f"{what} already ran (every backward runs exactly once)")
        for buf in adds:
            try:
                states.add(buf)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            resident[buf] = members(buf)
        option = None
        if isinstance(op, Loss):
            need, dt = total(resident) + problem.loss_tmp, problem.loss_time
        else:
            stage = problem.stages[k]
            option = stage.options[opts[k]]
            if isinstance(op, B):
                need = total(resident) + option.bwd_tmp - option.bwd_release
                dt = option.bwd_time
            elif isinstance(op, F_all):
                need, dt = total(resident) + option.rec_tmp, option.rec_time
            else:
                need, dt = total(resident) + stage.fwd_tmp, stage.fwd_time
        for buf in frees:
            try:
                states.free(buf)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            del resident[buf]
        done[k] = done[k] or isinstance(op, Loss | B)
        copies.run(recorder, op, option, need, total(resident), dt,
                   lambda: (f"{b[0]}[{b[1]}]" for b in resident))  # fmt: skip
        host_after.append(host_total())
    check_complete_step(done, len(ops))
    trace = recorder.trace(ops)
    return dataclasses.replace(
        trace,
        makespan=max(trace.makespan, copies.last),
        serial_makespan=copies.serial,
        host_resident=tuple(host_after),
    )


def block_lanes(problem: BlockChain, schedule: object, trace: Trace) -> dict[str, list[Span]]:
    """The ``compute`` lane (kind = the op's class: F_ck, F_n, F_all, Loss, B) and,
    where the schedule copies whole buffers to host memory and back, a ``copies`` lane:
    each ``Offload`` and ``Prefetch`` where it is issued, as ``"copy"``. They take no
    time here (:func:`simulate_blocks`; the offload simulator times them), so they are
    drawn at least a pixel wide; a host-memory variant's copies run inside its
    recording's and backward's times and are not drawn apart."""
    spans = chain_lanes(problem, schedule, trace)["compute"]  # one per op, kind its class
    compute = [sp for sp in spans if sp.kind not in ("Offload", "Prefetch", "Wait", "Evict")]
    copies = [dataclasses.replace(sp, kind="copy") for sp in spans
              if sp.kind in ("Offload", "Prefetch")]  # fmt: skip
    return {"compute": compute, "copies": copies} if copies else {"compute": compute}


class _CopyStream:
    """The copies of host-memory variants on the copy engines, beside the compute ops
    (module docstring): when each op starts, and the serialized time."""

    def __init__(self) -> None:
        self.engines = CopyEngines()
        self.copied_out: dict[int, float] = {}  # stage -> when its copy-out ends
        self.before = 0.0  # start of the last compute op
        self.last = 0.0  # end of the last copy
        self.serial = 0.0

    def run(self, recorder: TraceRecorder, op, option, need, resident, dt, names) -> None:
        """Record compute op ``op`` (``option``: its stage's, None for the loss) taking
        ``dt`` seconds, its copies included."""
        self.serial += dt
        wait, out = 0.0, 0.0
        if option is not None and isinstance(op, B) and option.copy_back:
            ready = max(self.before, self.copied_out.get(op.index, 0.0))
            wait = self.engines.issue("prefetch", ready, option.copy_back)[1]
            self.last = max(self.last, wait)
            dt -= option.copy_back
        elif option is not None and isinstance(op, F_all):
            out = option.copy_out
            dt -= out
        recorder.record(need, resident, dt, names, not_before=wait)
        self.before = recorder.start[-1]
        if out:
            end = self.engines.issue("offload", recorder.clock, out)[1]
            self.copied_out[op.index] = end
            self.last = max(self.last, end)
