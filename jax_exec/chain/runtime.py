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

from jax_exec.buffers import Buffers
from jax_exec.execute.result import OpMeter, RunResult, tree_bytes
from jax_exec.execute.tree import check_schedule
from jax_exec.kernels import chain_kernels, loss_kernel
from jax_exec.stages.split import split_layers
from schedir import B, F_all, Loss, Schedule
from schedir.chain.ops import buffer_moves


def put(buf: Buffers, name: tuple[str, int], arrays: tuple) -> None:
    # The gradient of an integer input (token ids) is float0, not an array: the
    # buffer holds nothing.
    buf.put(name, tuple(arr for arr in arrays if arr.dtype != jax.dtypes.float0))


def compute(op: Any, buf: Buffers, step: ChainStep, grads: list) -> tuple[int, int, Any]:
    """Run one chain compute op on ``buf`` (the effects of ``schedir.chain`` ops).

    Returns ``(need, temp, loss)``: live bytes right after the op produced its output
    plus its kernel's temporary bytes, those temporary bytes, and the loss (``Loss``
    only, else None). Parameter gradients of ``B`` go to ``grads``.
    """
    L = len(step.stages)
    # Which buffers the op reads, adds and frees is the IR's op table (written once in
    # schedir.chain.ops); this function only runs the kernels and measures.
    reads, (out_name,), frees = buffer_moves(op, L, buf.table)
    src = reads[-1]  # the input of stage k: a[k], or abar[k] (which holds a_k)
    a = buf.table[src][0]
    loss = None
    if isinstance(op, Loss):
        loss, d = step.loss.call(a, step.y)
        jax.block_until_ready(d)
        put(buf, out_name, (d,))
        temp = step.loss.temp_bytes
    elif isinstance(op, B):
        k = op.index
        stage, kern = step.stages[k], step.kernels[k]
        saved = buf.table["abar", k + 1]
        (d_out,) = buf.table["d", k + 1]
        args = (stage.params, stage.rest, (a,), saved[0], saved[1:], (d_out,))
        grads[k], (d,) = kern.bwd.call(*args)
        jax.block_until_ready(d)
        put(buf, out_name, (d,))
        temp = kern.bwd.temp_bytes
    else:  # F_ck, F_n, F_all (buffer_moves refused anything else)
        k = op.index
        stage, kern = step.stages[k], step.kernels[k]
        if isinstance(op, F_all):
            out, new = kern.rec.call(stage.params, stage.rest, (a,))
            jax.block_until_ready(out)
            put(buf, out_name, (out, *new))
            temp = kern.rec.temp_bytes
        else:
            out = kern.fwd.call(stage.params, stage.rest, (a,))
            jax.block_until_ready(out)
            put(buf, out_name, (out,))
            temp = kern.fwd.temp_bytes
    need = buf.bytes() + temp
    for name in frees:
        buf.drop(name)
    return need, temp, loss


@dataclass(frozen=True)
class ChainStep:
    """What every chain op of one step reads: the stages, their compiled kernels, the
    loss kernel and the target."""

    stages: list
    kernels: list
    loss: Any
    y: Any


def chain_step(layers: Sequence[Any], loss_fn: Callable, x: Any, y: Any):
    """``(model, step, x)``: the layers split into stages, their kernels, x as an array."""
    model = split_layers(layers)
    x = jax.numpy.asarray(x)
    kernels, specs = chain_kernels(model.stages, x)
    return model, ChainStep(model.stages, kernels, loss_kernel(loss_fn, specs[-1], y), y), x


def has_copies(ops: Sequence) -> bool:
    """Whether ``ops`` (op objects or their printed forms) hold copy ops."""
    names = (op if isinstance(op, str) else type(op).__name__ for op in ops)
    return any(n.strip().startswith(("Offload", "Prefetch", "Wait")) for n in names)


def run_chain(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    schedule: Schedule | Sequence,
    x: jax.Array,
    y: Any,
) -> RunResult:
    """Run one training step of ``layers`` op by op following a chain ``schedule``.

    Returns the loss, the parameter gradients and the measured memory and time of
    every op (:class:`jax_exec.RunResult`). Raises :class:`schedir.InvalidSchedule` for
    a schedule made for another chain length or one that cannot run (copy ops:
    :func:`jax_exec.run` sends those to :func:`jax_exec.offload.runtime.run_offload`).
    """
    model, step, x = chain_step(layers, loss_fn, x, y)
    ops = check_schedule(schedule, len(step.stages))
    buf = input_buffers(x)
    grads: list = [None] * len(step.stages)
    loss = None
    meter = OpMeter(buf.bytes())
    for op in ops:
        start = time.perf_counter()
        need, temp, value = compute(op, buf, step, grads)
        loss = value if value is not None else loss
        meter.record(time.perf_counter() - start, temp, need, buf.bytes())
    meter.stop()
    buf.clear()  # only d[0] is left: free it, the caller gets grads
    return chain_result(meter, model, loss, grads, x, y, ops)


def input_buffers(x: jax.Array) -> Buffers:
    """The buffers at the start of a step: ``a[0]`` holds x (the caller's: never deleted)."""
    buf = Buffers()
    buf.put(("a", 0), (x,), owned=False)
    return buf


def chain_result(
    meter: OpMeter, model: Any, loss: Any, grads: list, x: Any, y: Any, ops: tuple
) -> RunResult:
    """The step's result; a shared parameter gets the sum of its per-layer gradients."""
    grads = model.fold(grads)
    return meter.result(
        loss=loss,
        grads=grads,
        param_bytes=tree_bytes(model.params()),
        grad_bytes=tree_bytes(grads),
        batch_bytes=tree_bytes(x) + tree_bytes(y),
        ops=ops,
    )
