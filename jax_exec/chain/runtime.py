"""The op-by-op runtime (docs/jax_exec.md, runtime path).

Each op of a chain schedule runs as one compiled kernel (:mod:`jax_exec.kernels`) on
explicit buffers named like the simulator's: ``a[k]`` holds a_k, ``abar[k]`` holds a_k
and the new residuals of stage k-1, ``d[k]`` holds the gradient of a_k. A buffer is
deleted (``Array.delete()``) as soon as the schedule drops it, so the live activation
bytes after every op are exactly what the simulator predicts for the profiled chain.
They are measured from the arrays held (distinct arrays, ``nbytes``), not taken from
the chain. Parameters, parameter gradients and the batch are reported separately; the
input x is the initial ``a[0]`` (as in the chain model) and is never deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from jax_exec.chain.tree import check_schedule
from jax_exec.kernels import chain_kernels, loss_kernel
from jax_exec.stages import split_layers
from schedir import B, F_all, F_ck, F_n, GraphSchedule, Loss, Schedule


@dataclass(frozen=True)
class RunResult:
    """What one op-by-op training step did.

    Attributes:
        loss: the loss value (a scalar array).
        grads: one parameter-gradient pytree per layer (``nnx.State`` for NNX layers); a
            parameter several layers read is in the first of them, with the sum of
            the gradients of its uses.
        peak_bytes: max over the initial state and every op of ``op_peak_bytes``.
        initial_bytes: activation bytes before the first op (a_0).
        resident_bytes: live activation bytes after each op.
        op_peak_bytes: bytes each op needed: live activation bytes right after it
            produced its output (before freeing anything) plus its temporary bytes.
        op_temp_bytes: temporary bytes of each op's compiled kernel.
        op_times: wall time of each op, seconds (dispatch to completion).
        total_time: wall time of the whole step, seconds.
        param_bytes: bytes of the parameters, each once (not in the activation figures).
        grad_bytes: bytes of the parameter gradients (not in the activation figures).
        batch_bytes: bytes of x and y.
        ops: the ops that ran.
    """

    loss: jax.Array
    grads: list
    peak_bytes: int
    initial_bytes: int
    resident_bytes: tuple[int, ...]
    op_peak_bytes: tuple[int, ...]
    op_temp_bytes: tuple[int, ...]
    op_times: tuple[float, ...]
    total_time: float
    param_bytes: int
    grad_bytes: int
    batch_bytes: int
    ops: tuple


def _tree_bytes(tree: Any) -> int:
    return sum(int(leaf.nbytes) for leaf in jax.tree_util.tree_leaves(tree))


class _Buffers:
    """The named buffers and their live bytes (distinct arrays only)."""

    def __init__(self, x: jax.Array) -> None:
        self.table: dict[tuple[str, int], tuple[jax.Array, ...]] = {}
        self.nbytes: dict[int, int] = {}  # id -> bytes, read from each array once
        self.keep = {id(x)}  # arrays the runtime does not own (never deleted)
        self.put(("a", 0), (x,))

    def put(self, name: tuple[str, int], arrays: tuple[jax.Array, ...]) -> None:
        # The gradient of an integer input (token ids) is float0, not an array: the
        # buffer holds nothing.
        arrays = tuple(arr for arr in arrays if arr.dtype != jax.dtypes.float0)
        self.table[name] = arrays
        for arr in arrays:
            self.nbytes.setdefault(id(arr), int(arr.nbytes))

    def get_input(self, k: int) -> tuple[str, int]:
        for name in (("a", k), ("abar", k)):
            if name in self.table:
                return name
        raise RuntimeError(f"a[{k}] or abar[{k}] should be resident")  # pragma: no cover

    def bytes(self) -> int:
        live = {id(arr) for arrays in self.table.values() for arr in arrays}
        return sum(self.nbytes[i] for i in live)

    def drop(self, name: tuple[str, int]) -> None:
        arrays = self.table.pop(name)
        alive = {id(arr) for group in self.table.values() for arr in group}
        for arr in arrays:
            if id(arr) not in alive:
                self.nbytes.pop(id(arr), None)
                if id(arr) not in self.keep:
                    arr.delete()


def has_copies(ops: Sequence) -> bool:
    """Whether ``ops`` (op objects or their printed forms) hold copy ops."""
    names = (op if isinstance(op, str) else type(op).__name__ for op in ops)
    return any(n.strip().startswith(("Offload", "Prefetch", "Wait")) for n in names)


def run(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    schedule: Schedule | Sequence,
    x: jax.Array,
    y: Any,
) -> RunResult:
    """Run one training step of ``layers`` op by op following ``schedule``.

    Returns the loss, the parameter gradients and the measured memory and time of
    every op (:class:`RunResult`). Raises :class:`schedir.InvalidSchedule` for a
    schedule made for another chain length or one that cannot run. A schedule with
    copy ops (``Offload``, ``Prefetch``, ``Wait``) runs in
    :func:`jax_exec.offload.runtime.run_offload` and returns an ``OffloadRunResult``. A
    ``GraphSchedule`` runs a DAG model (``layers``: a dict of nodes, ``x``: a dict of
    inputs) in :func:`jax_exec.graph.runtime.run_graph`, which returns a ``GraphRunResult``.
    """
    if isinstance(schedule, GraphSchedule):  # a DAG model and a graph schedule
        from jax_exec.graph.runtime import run_graph

        return run_graph(layers, loss_fn, None, schedule, x, y)
    if not hasattr(schedule, "ops"):
        schedule = tuple(schedule)
    if has_copies(schedule.ops if hasattr(schedule, "ops") else schedule):
        from jax_exec.offload.runtime import (
            run_offload,  # copy ops: the runtime with host memory
        )

        return run_offload(layers, loss_fn, schedule, x, y)
    model = split_layers(layers)
    stages = model.stages
    L = len(stages)
    ops = check_schedule(schedule, L)
    x = jax.numpy.asarray(x)
    kernels, specs = chain_kernels(stages, x)
    loss_k = loss_kernel(loss_fn, specs[-1], y)

    buf = _Buffers(x)
    grads: list = [None] * L
    loss = None
    initial = buf.bytes()
    resident, op_peak, op_temp, op_times = [], [], [], []
    step_start = time.perf_counter()
    for op in ops:
        start = time.perf_counter()
        if isinstance(op, Loss):
            src = buf.get_input(L)
            loss, d = loss_k.call(buf.table[src][0], y)
            jax.block_until_ready(d)
            buf.put(("d", L), (d,))
            temp = loss_k.temp_bytes
            need = buf.bytes() + temp
            if src[0] == "a":
                buf.drop(src)
        elif isinstance(op, B):
            k = op.index
            stage, kern = stages[k], kernels[k]
            src = buf.get_input(k)
            saved = buf.table["abar", k + 1]
            (d_out,) = buf.table["d", k + 1]
            args = (stage.params, stage.rest, buf.table[src][0], saved[0], saved[1:], d_out)
            grads[k], d = kern.bwd.call(*args)
            jax.block_until_ready(d)
            buf.put(("d", k), (d,))
            temp = kern.bwd.temp_bytes
            need = buf.bytes() + temp
            if src[0] == "a":
                buf.drop(src)
            buf.drop(("d", k + 1))
            buf.drop(("abar", k + 1))
        elif isinstance(op, F_ck | F_n | F_all):
            k = op.index
            stage, kern = stages[k], kernels[k]
            src = buf.get_input(k)
            a = buf.table[src][0]
            if isinstance(op, F_all):
                out, new = kern.rec.call(stage.params, stage.rest, a)
                jax.block_until_ready(out)
                buf.put(("abar", k + 1), (out, *new))
                temp = kern.rec.temp_bytes
            else:
                out = kern.fwd.call(stage.params, stage.rest, a)
                jax.block_until_ready(out)
                buf.put(("a", k + 1), (out,))
                temp = kern.fwd.temp_bytes
            need = buf.bytes() + temp
            if isinstance(op, F_n):
                buf.drop(src)
        else:  # pragma: no cover - check_schedule rejects foreign ops
            raise TypeError(f"not a chain op: {op!r}")
        op_times.append(time.perf_counter() - start)
        op_temp.append(temp)
        op_peak.append(need)
        resident.append(buf.bytes())
    total = time.perf_counter() - step_start
    for name in list(buf.table):  # only d[0] is left: free it, the caller gets grads
        buf.drop(name)
    grads = model.fold(grads)  # a shared parameter: the sum of its per-layer gradients

    return RunResult(
        loss=loss,
        grads=grads,
        peak_bytes=max([initial, *op_peak]),
        initial_bytes=initial,
        resident_bytes=tuple(resident),
        op_peak_bytes=tuple(op_peak),
        op_temp_bytes=tuple(op_temp),
        op_times=tuple(op_times),
        total_time=total,
        param_bytes=_tree_bytes(model.params()),
        grad_bytes=_tree_bytes(grads),
        batch_bytes=_tree_bytes(x) + _tree_bytes(y),
        ops=ops,
    )
