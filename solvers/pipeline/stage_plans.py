"""What one micro-batch of a chunk costs under a per-micro-batch memory budget.

A chunk [i, j) of a training pipeline is planned as a chain of its own
(:func:`sub_chain`: its loss is the arrival of d_j, or the real loss on the last
chunk). Under a budget of b bytes per micro-batch it runs one of (:class:`Plan`):

- ``store_all``: its forward and backward, holding the store-all peak (simulated);
- ``rotor``: rotor's optimal rematerialization under b (the table of
  ``solvers.chain.rotor``, built once per chunk for every budget); the extra seconds
  are recomputation;
- ``offload``: rotor_offload's remat + activation offload under b, when the platform
  has a host link (``platform.offload`` / ``prefetch`` of non-zero bandwidth, one
  copy engine per device and direction; its table, once per chunk, unless the host
  memory is bounded, which needs a solve per budget); the extra seconds are
  recomputation and the compute stream's waits for copies.

Low-bit storage (``storages``: per storage name, the chain with every stage's saved
residuals stored in it and their encoding and decoding in its backward times, as the
JAX side measures them: ``jax_exec.auto.lowbit``) adds, per storage, its store-all and
rotor plans on that chain (``Plan.storage``); the chunk's fastest plan within the
budget is taken over every storage, full precision first on ties. Offload plans stay
in full precision.

Sizes are rounded up to slots of about 1/``slots`` of the chunk's store-all need (a
plan feasible in slots is feasible in bytes; ``Plan.exact`` says when the sizes' gcd
made the table exact). A plan's footprint is the least tabulated budget with its
time.

A pipeline schedule carries a plan as the chunk's
:class:`~schedir.pipeline.schedule.ChunkPlan` (:meth:`StagePlans.chunk_plan`: its
footprint, reserved from its forward's start to its backward's end, of which it holds
``held`` between them, :func:`schedir.pipeline.ops.effect`; its kind; a rotor plan's
chain ops, an offload plan's chain and copy ops and the ``host`` bytes it keeps in
host memory between them; a low-bit plan's storage) and its extra seconds as
``Bwd.recompute`` (speed 1); a chunk whose input the chunk before it makes on the
same device (the V-shape's turn) counts that input once (:meth:`StagePlans.
chunk_plans`). The plan of a chunk is computed on the chunk alone: its copies do not
contend with other micro-batches' (one op at a time runs on a device) and host
memory is split evenly among the micro-batches in flight of all devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np

from schedir import Chain, Loss, OffloadProblem, discretize, simulate, simulate_offload
from schedir.chain.discretize import size_unit
from schedir.chain.ops import buffer_moves
from schedir.offload.ops import Evict, Offload, Prefetch, Wait
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import ChunkPlan
from schedir.platform import Device, Platform
from solvers.chain._rotor_dp import build_table as rotor_table
from solvers.chain.store_all import store_all_ops
from solvers.offload.rotor_offload import build_table as offload_table
from solvers.registry import Infeasible, solve


def sub_chain(chain: Chain, i: int, j: int) -> Chain:
    """Stages i..j-1 as a chain; its loss is the real loss if j == L, else the arrival
    of d_j (no time, x_j bytes)."""
    L = chain.length
    if j == L:
        tail = (chain.fwd_time[L], chain.bwd_time[L], chain.in_size[L], 0, 0, chain.bwd_tmp[L])
    else:
        tail = (0.0, 0.0, chain.in_size[j], 0, 0, 0)
    return Chain(
        fwd_time=(*chain.fwd_time[i:j], tail[0]),
        bwd_time=(*chain.bwd_time[i:j], tail[1]),
        in_size=(*chain.in_size[i:j], tail[2]),
        saved_size=(*chain.saved_size[i:j], tail[3]),
        fwd_tmp=(*chain.fwd_tmp[i:j], tail[4]),
        bwd_tmp=(*chain.bwd_tmp[i:j], tail[5]),
    )


@dataclass(frozen=True)
class Plan:
    """One micro-batch of a chunk: ``time`` (seconds at speed 1, forward + backward,
    the loss included on the last chunk), ``extra`` (seconds over store-all),
    ``footprint`` (bytes: the plan's peak), ``kind`` ("store_all", "rotor",
    "offload"), whether the chain solver's answer was ``exact``, and ``held``: the
    device bytes its chain schedule holds between its forward and its backward (before
    its ``Loss``; the target not included), None where the executed schedule is not
    known, which counts as the whole footprint; ``storage``: the low-bit storage of
    its saved residuals (None: full precision); an offload plan's ``host`` bytes
    (offloaded buffers held in host memory before its ``Loss``) and ``ops`` (its
    chain and copy ops, rotor_offload's schedule)."""

    time: float
    extra: float
    footprint: int
    kind: str
    exact: bool = True
    held: int | None = None
    storage: str | None = None
    host: int | None = None
    ops: tuple = field(default=(), compare=False, repr=False)


@lru_cache(maxsize=16)
def _shared(chain, target, offload, prefetch, host_memory, slots: int, use_offload: bool,
            storages: tuple):  # fmt: skip
    plat = Platform(host_memory=host_memory, offload=offload, prefetch=prefetch,
                    devices=(Device("plans"),))  # fmt: skip
    return StagePlans(PipelineProblem(chain, (0,) * chain.length, plat, training=True,
                                      target_bytes=target), slots, use_offload,
                      storages)  # fmt: skip


def shared_plans(problem: PipelineProblem, slots: int = 500, offload: bool = True,
                 storages: Sequence[tuple[str, Chain]] = ()):  # fmt: skip
    """One :class:`StagePlans` per chain, target, host link, ``slots`` and low-bit
    ``storages`` (plans do not depend on the devices' memories), so that solves of the
    same model at several memories share their chain solves."""
    p = problem.platform
    return _shared(problem.chain, problem.target_bytes, p.offload, p.prefetch, p.host_memory,
                   slots, offload, tuple(storages))  # fmt: skip


def has_host_link(platform: Platform) -> bool:
    return platform.offload.bandwidth > 0 and platform.prefetch.bandwidth > 0


@dataclass(frozen=True)
class Curve:
    """A chain solver's optimal time for every budget, from one table: ``values[k]``
    seconds at ``(k + offset) * slot`` bytes (inf where infeasible; non-increasing);
    ``exact``: sizes in units of their gcd (else rounded up to the slot)."""

    values: np.ndarray
    slot: int
    offset: int
    exact: bool
    kind: str
    table: object = field(default=None, compare=False, repr=False)  # the solver's table

    def at(self, budget: int) -> tuple[float, int] | None:
        """(seconds, footprint bytes) of the best plan within ``budget`` bytes: the
        footprint is the least tabulated budget with that time (its schedule fits it)."""
        k = budget // self.slot - self.offset
        if k < 0:
            return None
        k = min(k, len(self.values) - 1)
        v = float(self.values[k])
        if not math.isfinite(v):
            return None
        first = int(np.argmax(self.values <= v))  # values are non-increasing in memory
        return v, (first + self.offset) * self.slot


class StagePlans:
    """Cached plans of the chunks of ``problem``; ``slots``: the tables' resolution
    (sizes rounded up to about 1/``slots`` of a chunk's store-all need, exact when the
    sizes' gcd gives fewer units); ``storages``: ``(name, chain)`` per low-bit storage
    (module docstring; the chains have the problem's stages, inputs and forward
    times)."""

    def __init__(self, problem: PipelineProblem, slots: int = 500, offload: bool = True,
                 storages: Sequence[tuple[str, Chain]] = ()):  # fmt: skip
        self.problem, self.slots = problem, slots
        self.offload = offload and has_host_link(problem.platform)
        self.chains: dict[str | None, Chain] = {None: problem.chain}
        for name, chain in storages:
            if chain.length != problem.length or chain.in_size != problem.chain.in_size:
                raise ValueError(f"storages: the chain of {name!r} is not the problem's "
                                 "stages (length and inputs differ)")  # fmt: skip
            self.chains[name] = chain
        self.exact = True  # every chain answer computed so far was exact
        self.plan = cache(self._plan)
        self.store_all = cache(self._store_all)
        self.least = cache(self._least)
        self.curve = cache(self._curve)
        self.rotor_held = cache(self._rotor_held)
        self.budgets = cache(self._budgets)
        self.offload_at = cache(self._offload_at)

    def _store_all(self, i: int, j: int, storage: str | None = None) -> Plan:
        """Chunk [i, j) storing every activation (in ``storage``; None: full
        precision); its extra seconds over the full-precision store-all plan."""
        sub = sub_chain(self.chains[storage], i, j)
        peak = simulate(sub, store_all_ops(sub)).peak_memory
        time = sub.store_all_time()
        extra = 0.0 if storage is None else max(0.0, time - self.store_all(i, j).time)
        return Plan(time, extra, int(peak), "store_all", held=self.held(i, j, (), storage),
                    storage=storage)  # fmt: skip

    def _rotor_held(self, i: int, j: int, units: int, storage: str | None = None) -> int | None:
        """What rotor's schedule of chunk [i, j) at ``units`` slots holds between its
        forward and its backward (None where rotor has no schedule there)."""
        table = self.curve(i, j, "rotor", storage).table
        if not math.isfinite(table.value(units)):
            return None
        return self.held(i, j, table.ops(units), storage)

    def _rotor(self, i: int, j: int, seconds: float, footprint: int, exact: bool,
               storage: str | None = None) -> Plan:  # fmt: skip
        """A rotor plan of ``footprint`` bytes (a tabulated budget) and its ``held``."""
        held = self.rotor_held(i, j, footprint // self.curve(i, j, "rotor", storage).slot,
                               storage)  # fmt: skip
        return Plan(seconds, seconds - self.store_all(i, j).time, footprint, "rotor", exact,
                    held, storage)  # fmt: skip

    def _budgets(self, i: int, j: int) -> tuple[int, ...]:
        """The budgets (bytes per micro-batch, increasing) at which the fastest plan of
        chunk [i, j) changes: each distinct plan of the tables at its least budget, and
        the store-all peak (:meth:`within` at one of them is that plan)."""
        out = {self.store_all(i, j, s).footprint for s in self.chains}
        for kind, storage in self._kinds():
            curve = self.curve(i, j, kind, storage)
            v = curve.values
            first = np.flatnonzero(np.isfinite(v) & np.concatenate([[True], v[1:] < v[:-1]]))
            out.update(int((k + curve.offset) * curve.slot) for k in first)
        top = self.store_all(i, j).footprint
        return tuple(sorted(b for b in out if b <= top))

    def _kinds(self) -> list[tuple[str, str | None]]:
        """(chain solver, storage) of every tabulated plan: rotor in every storage,
        offload in full precision."""
        out = [("rotor", s) for s in self.chains]
        return out + [("offload", None)] if self.offload else out

    def _least(self, i: int, j: int) -> int:
        """The least per-micro-batch bytes of rotor's plans in its table (offloading
        may go lower); the store-all peak if that is less."""
        curve = self.curve(i, j, "rotor")
        finite = np.flatnonzero(np.isfinite(curve.values))
        if finite.size == 0:
            return self.store_all(i, j).footprint
        return min(int((finite[0] + curve.offset) * curve.slot), self.store_all(i, j).footprint)

    def _curve(self, i: int, j: int, kind: str, storage: str | None = None) -> Curve:
        """The time/memory curve of rotor ("rotor") or rotor_offload ("offload") on the
        chain of ``storage``; slots sized on the full-precision store-all need."""
        sub = sub_chain(self.chains[storage], i, j)
        top = self.store_all(i, j).footprint
        unit = size_unit(sub)
        slot = unit if top // unit <= self.slots else -(-top // self.slots)
        if kind == "rotor":
            d = discretize(sub, top, slot_size=slot)
            table = rotor_table(d.chain, d.budget)
            x0 = d.chain.in_size[0]
            values = np.array([table.value(b) for b in range(x0, d.budget + 1)])
            return Curve(values, slot, x0, slot == unit, "rotor", table)
        plat = self.problem.platform
        off = OffloadProblem(sub, Platform(offload=plat.offload, prefetch=plat.prefetch))
        table = offload_table(off, slot)
        x0 = table.model.x[0]
        values = np.asarray(table.tables[0][0][table.model.L], dtype=float)
        return Curve(values, slot, int(x0), slot == unit, "offload", table)

    def _plan(self, i: int, j: int, budget: int, share_host: int = 1) -> Plan | None:
        """The fastest plan of chunk [i, j) within ``budget`` bytes per micro-batch
        (None if none fits); ``share_host``: micro-batches sharing the host memory."""
        base = self.store_all(i, j)
        if budget >= base.footprint:
            return base
        best = None
        # full precision first: a low-bit plan is taken only where it is faster
        stored = [("store_all", s) for s in self.chains if s is not None]
        for kind, storage in stored + self._kinds():
            if kind == "store_all":
                got = self.store_all(i, j, storage)
                got = got if got.footprint <= budget else None
            elif kind == "offload" and self.problem.platform.host_memory is not None:
                got = self._offload(i, j, budget, base, share_host)  # the host may not hold it
            else:
                curve = self.curve(i, j, kind, storage)
                hit = curve.at(budget)
                if hit is None:
                    got = None
                elif kind == "rotor":
                    got = self._rotor(i, j, hit[0], hit[1], curve.exact, storage)
                elif best is not None and hit[0] >= best.time - 1e-15:
                    got = None  # not faster: its schedule is not read
                else:
                    got = self.offload_at(i, j, hit[1])
            if got is not None and (best is None or got.time < best.time - 1e-15):
                best = got
        if best is not None:
            self.exact = self.exact and best.exact
        return best

    def _offload(self, i: int, j: int, budget: int, base: Plan, share_host: int) -> Plan | None:
        """rotor_offload solved at ``budget`` with the host memory split ``share_host``
        ways (its table cannot tell whether the host holds the offloads)."""
        plat = self.problem.platform
        host = plat.host_memory // max(1, share_host)
        sub = sub_chain(self.problem.chain, i, j)
        off = OffloadProblem(sub, Platform(
            device_memory=budget, host_memory=host, offload=plat.offload,
            prefetch=plat.prefetch))  # fmt: skip
        try:
            s = solve(off, budget, "rotor_offload", slots=self.slots)
        except Infeasible:
            return None
        t, exact = s.meta["makespan"], bool(s.meta.get("exact", False))
        if s.meta.get("fallback") == "rotor":
            return self._rotor(i, j, t, int(s.meta["peak_memory"]), exact)
        return self._offload_plan(i, j, t, int(s.meta["peak_memory"]), exact, s.ops)

    def _offload_at(self, i: int, j: int, footprint: int) -> Plan:
        """The offload plan of chunk [i, j) that its table keeps at ``footprint`` bytes
        (a tabulated budget, :meth:`Curve.at`): every budget up to the next tabulated
        one reads the same schedule, emitted and simulated once."""
        curve = self.curve(i, j, "offload")
        seconds, _ = curve.at(footprint)
        ops = curve.table.ops(footprint)
        return self._offload_plan(i, j, seconds, footprint, curve.exact, ops)

    def _offload_plan(self, i: int, j: int, seconds: float, footprint: int, exact: bool,
                      ops: tuple) -> Plan:  # fmt: skip
        """An offload plan running ``ops`` (chain and copy ops of chunk [i, j)): its
        device and host bytes before its ``Loss``, from the offload simulator."""
        plat = self.problem.platform
        sub = sub_chain(self.problem.chain, i, j)
        off = OffloadProblem(sub, Platform(offload=plat.offload, prefetch=plat.prefetch))
        trace = simulate_offload(off, ops)
        at = next(k for k, op in enumerate(ops) if isinstance(op, Loss))
        held = int(trace.resident[at - 1]) if at else int(trace.initial_memory)
        host = int(trace.host_resident[at - 1]) if at else 0
        return Plan(seconds, seconds - self.store_all(i, j).time, max(footprint, held),
                    "offload", exact, held, None, host, tuple(ops))  # fmt: skip

    def chain_ops(self, i: int, j: int, plan: Plan) -> tuple | None:
        """The chain schedule (ops of :func:`sub_chain` ``(i, j)``, local stages) that
        runs a rotor ``plan``: rotor's table read at the plan's footprint (its peak in
        bytes is at most the footprint); an offload plan's ops (copy ops included).
        None for store-all (the executors' default)."""
        if plan.kind == "offload":
            return plan.ops or None
        if plan.kind != "rotor":
            return None
        curve = self.curve(i, j, "rotor", plan.storage)
        units = plan.footprint // curve.slot
        if not math.isfinite(curve.table.value(units)):
            return None
        return curve.table.ops(units)

    def held(self, i: int, j: int, ops: Sequence = (), storage: str | None = None) -> int:
        """Bytes chunk [i, j) holds between its forward and its backward when it runs
        the chain schedule ``ops`` of its sub-chain (() : store-all), its residuals in
        ``storage``: what the schedule holds before its ``Loss``."""
        sub = sub_chain(self.chains[storage], i, j)
        ops = tuple(ops) or store_all_ops(sub)
        at = next(k for k, op in enumerate(ops) if isinstance(op, Loss))
        trace = simulate(sub, ops)
        return int(trace.resident[at - 1] if at else trace.initial_memory)

    def reserved(self, i: int, j: int, plan: Plan) -> tuple[int, int | None]:
        """(footprint, held): the bytes per micro-batch a schedule reserves for chunk
        [i, j) running ``plan`` (:class:`~schedir.pipeline.schedule.ChunkPlan`): its
        held bytes plus the micro-batch's ``target_bytes`` on the chunk with the loss,
        and its peak, at least that; held None where the plan does not say."""
        if plan.held is None:
            return plan.footprint, None
        target = self.problem.target_bytes if j == self.problem.length else 0
        held = plan.held + target
        return max(plan.footprint, held), held

    def chunk_plan(self, chunk: ChunkPlan, plan: Plan, local_input: bool = False) -> ChunkPlan:
        """``chunk`` running ``plan``: its footprint and held bytes (:meth:`reserved`),
        kind, storage, extra seconds and, for a rotor plan, the chain ops an executor
        runs (:meth:`chain_ops`). ``local_input``: the chunk's input is the output of
        the chunk before it on the same device (the V-shape's turn), whose stash holds
        it until after this chunk's backward: where the plan keeps its input on the
        device until its ``Loss`` (:meth:`holds_input`), it is counted there only, not
        twice (the runtime holds one array)."""
        i, j = chunk.first, chunk.last
        footprint, held = self.reserved(i, j, plan)
        ops = self.chain_ops(i, j, plan) or ()
        if local_input and held is not None and self.holds_input(i, j, ops):
            x = self.problem.chain.in_size[i]
            footprint, held = footprint - x, held - x
        return dataclasses.replace(chunk, footprint=footprint, held=held, kind=plan.kind,
                                   extra=plan.extra, ops=ops, storage=plan.storage,
                                   host=plan.host)  # fmt: skip

    def holds_input(self, i: int, j: int, ops: Sequence = ()) -> bool:
        """Whether chunk [i, j) running the chain schedule ``ops`` (() : store-all; copy
        ops included) keeps its input ``a[0]`` on the device up to its ``Loss``."""
        ops = tuple(ops) or store_all_ops(sub_chain(self.problem.chain, i, j))
        resident = {("a", 0)}
        for op in ops:
            if isinstance(op, Loss):
                return ("a", 0) in resident
            if isinstance(op, Offload | Prefetch):
                (resident.discard if isinstance(op, Offload) else resident.add)(op.key)
            elif not isinstance(op, Wait | Evict):
                _, adds, frees = buffer_moves(op, j - i, resident)
                resident = (resident - set(frees)) | set(adds)
        return False

    def chunk_plans(self, chunks: Sequence[ChunkPlan], plans: Sequence[Plan]) -> tuple:
        """The schedule's ``chunks`` (their plans, in order) running ``plans``
        (:meth:`chunk_plan`; a chunk whose input the chunk before it makes on the same
        device counts it once)."""
        made = {(c.last, c.device) for c in chunks}
        return tuple(self.chunk_plan(c, p, (c.first, c.device) in made)
                     for c, p in zip(chunks, plans, strict=True))  # fmt: skip

    def within(self, i: int, j: int, budget: float, share_host: int = 1) -> Plan | None:
        """:meth:`plan` for a real-valued budget (floored; inf: store-all)."""
        if math.isinf(budget):
            return self.store_all(i, j)
        if budget < 0:
            return None
        return self.plan(i, j, int(math.floor(budget)), share_host)
