"""Run a block-chain schedule op by op with measured memory (docs/auto.md, "Op by op").

Each op runs one compiled kernel of :class:`~jax_exec.program.model.BlockModel` on
explicit buffers named like the simulator's (:mod:`schedir.blocks`): ``a[c]`` holds
the values of cut c, ``abar[c]`` the same and the saved residuals of block c-1 under
its option, ``d[c]`` the cotangents of cut c's differentiated values. A value read by
a later block keeps the same array in every buffer that holds it; a cotangent that a
block does not touch keeps its array from ``d[c+1]`` to ``d[c]``. A buffer's arrays
are deleted when no buffer holds them any more. After every op the runtime measures
the live bytes of the arrays it holds (distinct arrays, ``nbytes``), and each op's
need = live bytes right after it made its output + its kernel's temporary bytes (for a
backward, the largest over its phases): for the block model these equal the
simulator's ``resident`` and ``op_peak`` exactly.

Parameters, parameter gradients, the call's arguments and the program outputs (the
model state after the call, ``aux``) are held outside and reported separately. The
model state after the step (BatchNorm statistics, RNG counters) is taken from the
first forward of each block; recomputations make the same values, which are dropped
(they are outputs, not activations, and are not counted), so state is updated once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.execute.buffers import HOST, Buffers
from jax_exec.execute.copies import carry_out
from jax_exec.execute.result import OpMeter, RunResult, tree_bytes
from jax_exec.program.model import BlockModel, global_values, through_flags
from jax_exec.program.placement import place
from schedir import B, F_all, Loss, Schedule
from schedir.blocks.simulate import schedule_options, simulate_blocks
from schedir.chain.ops import buffer_moves
from schedir.offload.effects import CopyEffect, CopyStates
from schedir.offload.ops import Evict, Offload, Prefetch, Wait


def run_backward(
    buf: Buffers, pb: Any, kernels: tuple, args: tuple, holders: dict | None, k: int,
    fetch: Callable[[Any], Any] | None = None, returns: dict[int, int] | None = None,
) -> tuple:  # fmt: skip
    """Run block k's backward phases (:mod:`jax_exec.program.phases`) on ``args`` (its eight
    argument groups): before each phase, free the block's own inputs no later phase
    reads (``holders``: group -> per argument, its buffer and key; None: free none, as
    graph nodes are freed by their own ops); after it, the intermediates no later
    phase reads. Intermediates are held in buffer
    ``("phase", k)`` (parameters' gradients outside). ``fetch``: of a host-memory
    variant (``holders`` given), copies an array to the device; ``returns``: index in
    group ``new`` -> phase, of its residuals in host memory and the phase before which
    each comes back (:meth:`~jax_exec.program.model.BlockModel.host_returns`). Returns
    ``(d_p, d_x, need, temp)``: need is the largest over phases of the live bytes after
    its outputs plus its kernel's temporary bytes, temp that kernel's."""
    env = dict(zip(pb.flat.in_ids, jax.tree_util.tree_leaves(args), strict=True))
    dp = set(pb.results[: pb.n_dp])
    scratch = ("phase", k)
    buf.table[scratch] = {}
    need, temp = -1, 0
    returns = returns or {}
    for j, (phase, kernel) in enumerate(zip(pb.phases, kernels, strict=True)):
        for pos, (group, i) in enumerate(pb.groups):
            if group == "new" and returns.get(i) == j:
                name, key = holders["new"][i]
                env[pb.flat.in_ids[pos]] = fetch(buf.table[name][key])
                buf.replace(name, key, env[pb.flat.in_ids[pos]])
        for pos in pb.free_args[j] if holders is not None else ():
            group, i = pb.groups[pos]
            buf.release(*holders[group][i])
            del env[pb.flat.in_ids[pos]]
        outs = kernel.call(*(env[v] for v in phase.ins))
        jax.block_until_ready(outs)
        for v, arr in zip((*phase.outs, *(vid for vid, _ in phase.extras)), outs, strict=True):
            env[v] = arr
            if v not in dp:
                buf.table[scratch][v] = arr
        here = buf.nbytes() + kernel.temp_bytes
        if here > need:
            need, temp = here, kernel.temp_bytes
        for v in pb.free_values[j]:
            buf.release(scratch, v)
            del env[v]
    found = [env[v] for v in pb.results]
    return tuple(found[: pb.n_dp]), tuple(found[pb.n_dp :]), need, temp


def run_schedule(
    model: BlockModel, schedule: Schedule, params: Any, rest: Any, args: tuple
) -> RunResult:
    """Run ``schedule`` (a :class:`schedir.blocks.BlockChain` schedule of ``model``, with
    copy ops or not) op by op on these parameters, state and arguments (module
    docstring). Which buffers an op reads, adds and frees is the IR's table
    (:func:`schedir.chain.ops.buffer_moves`, :mod:`schedir.offload.effects`); this
    function runs the kernels and copies and measures."""
    simulate_blocks(model.problem, schedule)  # a valid schedule, or InvalidSchedule
    options = schedule_options(model.problem, schedule)
    L = model.length
    gv = global_values(model, params, rest, args)
    buf = Buffers(id(a) for a in gv.values())
    buf.table["a", 0] = {}
    cuts = model.blocks.cuts
    results: dict[int, Any] = {}
    grads: dict[int, Any] = {}
    forwarded = [False] * (L + 1)
    loss = None
    states = CopyStates({("a", 0): "dev"})
    memory = _Memories(gv)
    copies = any(isinstance(op, Offload | Prefetch | Wait | Evict) for op in schedule.ops) or any(
        model.option(k, o).host for k, o in enumerate(options)
    )
    meter = OpMeter(buf.nbytes())

    def inputs(k: int, src: dict) -> tuple:
        lay = model.layouts[k]
        p = tuple(gv[v] for v in lay.params)
        g = tuple(gv[v] for v in lay.others)
        return p, g, tuple(src[v] for v in lay.ins)

    def add_grads(k: int, d_p: tuple) -> None:
        for vid, d in zip(model.layouts[k].params, d_p, strict=True):
            grads[vid] = d if vid not in grads else grads[vid] + d

    for op in schedule.ops:
        start = time.perf_counter()
        if isinstance(op, Offload | Prefetch | Wait | Evict):
            memory.copy(buf, states.effect(op))
            live = buf.nbytes()
            meter.record(time.perf_counter() - start, 0, live, live, host=buf.host_bytes())
            continue
        reads, (out,), frees = buffer_moves(op, L, buf.table)
        for change in states.reads(reads):  # a compute op waits for its prefetched inputs
            memory.copy(buf, change)
        src = reads[-1]  # a[k] or abar[k]: the values of cut k
        if isinstance(op, Loss):
            lay = model.layouts[L]
            kernel = model.kernel("loss", L)
            loss, res, d_p, d_x = kernel.call(*inputs(L, buf.table[src]))
            jax.block_until_ready(d_x)
            results.update(zip(lay.results, res, strict=True))
            buf.keep.update(id(r) for r in res)
            add_grads(L, d_p)
            active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
            buf.table[out] = dict(zip(active, d_x, strict=True))
            temp = kernel.temp_bytes
            need = buf.nbytes() + temp
        elif isinstance(op, B):
            k = op.index
            lay = model.layouts[k]
            fns = model.functions(k, options[k])
            saved = buf.table["abar", k + 1]
            d_next = buf.table["d", k + 1]
            p, g, x = inputs(k, buf.table[src])
            outs = tuple(saved[v] for v in lay.outs)
            res = tuple(results[v] for v in lay.results)
            new = tuple(saved[("new", j)] for j in range(len(fns.recipe.new)))
            act_outs = [v for v, a in zip(lay.outs, lay.act_out, strict=True) if a]
            d_outs = tuple(d_next[v] for v in act_outs)
            flags = through_flags(model, k)
            active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
            through = tuple(d_next[v] if f else None for v, f in zip(active, flags, strict=True))
            holders = {  # where the block's own inputs live, to free them once consumed
                "outs": [(("abar", k + 1), v) for v in lay.outs],
                "new": [(("abar", k + 1), ("new", j)) for j in range(len(new))],
                "d_outs": [(("d", k + 1), v) for v in act_outs],
                "through": [(("d", k + 1), v) for v, f in zip(active, flags, strict=True) if f],
            }
            pb, kernels = model.backward_kernels(k, options[k])
            d_p, d_x, need, temp = run_backward(
                buf, pb, kernels, (p, g, x, outs, res, new, d_outs, through), holders, k,
                memory.to_device_only, model.host_returns(k, options[k]),
            )  # fmt: skip
            memory.late.pop(("abar", k + 1), None)
            add_grads(k, d_p)
            d_here = dict(zip(active, d_x, strict=True))
            for v in cuts[k]:  # cotangents block k does not touch keep their array
                if v not in d_here and v in d_next:
                    d_here[v] = d_next[v]
            buf.table[out] = d_here
            buf.drop(("phase", k))
        else:  # F_ck, F_n, F_all (buffer_moves refused anything else)
            k = op.index
            lay = model.layouts[k]
            first = not forwarded[k]
            forwarded[k] = True
            if isinstance(op, F_all):
                kernel = model.kernel("record", k, options[k])
                outs, res, new = kernel.call(*inputs(k, buf.table[src]))
            else:
                kernel = model.kernel("forward", k)
                (outs, res), new = kernel.call(*inputs(k, buf.table[src])), ()
            jax.block_until_ready(outs)
            if first:  # the model state after the step comes from the first forward
                results.update(zip(lay.results, res, strict=True))
                buf.keep.update(id(r) for r in res)
            else:
                for r in res:
                    r.delete()
            values = {v: buf.table[src][v] for v in cuts[k + 1] if v in buf.table[src]}
            values.update(zip(lay.outs, outs, strict=True))
            values.update({("new", j): a for j, a in enumerate(new)})
            buf.table[out] = values
            temp = kernel.temp_bytes
            need = buf.nbytes() + temp
            if isinstance(op, F_all):  # a host-memory variant's: to host memory now
                memory.keep_on_host(buf, out, model.host_residuals(k, options[k]))
        states.add(out)
        for name in frees:
            states.free(name)
            buf.drop(name)
        host = buf.host_bytes() if copies else None  # host figures only with copy ops
        devices = buf.device_nbytes() if model.sharded else None
        meter.record(time.perf_counter() - start, temp, need, buf.nbytes(), host=host,
                     devices=devices)  # fmt: skip
    meter.stop()
    buf.clear()  # what the schedule left: the results are held outside
    call = (params, rest, args)
    return step_result(model, call, gv, grads, results, loss, meter, schedule.ops)


class _Memories:
    """The device's default memory and its ``pinned_host`` memory (the arrays' device:
    the first global value's, or JAX's default device), and the copies between them. A
    value held by several buffers is copied once each way, as the simulator counts it
    once: an array already in host memory (or still on the device) is shared. A
    host-memory variant's residuals stay in host memory from its recording to its
    backward (:meth:`keep_on_host`): whole-buffer copies leave them where they are."""

    def __init__(self, gv: dict) -> None:
        arrays = [a for a in gv.values() if isinstance(a, jax.Array)]
        device = next(iter(arrays[0].devices())) if arrays else jax.devices()[0]
        self.device = jax.sharding.SingleDeviceSharding(device)
        self.host = jax.sharding.SingleDeviceSharding(device, memory_kind=HOST)
        self.host_copy: dict[int, tuple] = {}  # device array id -> (device array, host array)
        self.device_copy: dict[int, tuple] = {}  # host array id -> (host array, device array)
        self.late: dict[Any, frozenset] = {}  # buffer -> keys of its residuals kept on host

    def keep_on_host(self, buf: Buffers, name: Any, late: dict) -> None:
        """Move the residuals ``("new", i)`` for ``i`` in ``late`` of buffer ``name`` (a
        recording) to host memory, until its backward fetches them."""
        if not late:
            return
        keys = frozenset(("new", i) for i in late)
        for key in sorted(keys):
            buf.replace(name, key, jax.device_put(buf.table[name][key], self.host))
        jax.block_until_ready([buf.table[name][key] for key in keys])
        self.late[name] = keys

    def to_device_only(self, arr: Any) -> Any:
        """A residual kept in host memory back on the device (its host array is then
        deleted)."""
        return jax.block_until_ready(jax.device_put(arr, self.device))

    def to_host(self, buf: Buffers, arr: Any) -> Any:
        held = self.host_copy.get(id(arr))
        if held is not None and not held[1].is_deleted():
            return held[1]
        copy = jax.device_put(arr, self.host)
        self.host_copy[id(arr)] = (arr, copy)
        self.device_copy[id(copy)] = (copy, arr)
        return copy

    def to_device(self, buf: Buffers, arr: Any) -> Any:
        held = self.device_copy.get(id(arr))
        if held is not None and not held[1].is_deleted() and id(held[1]) in buf.live():
            return held[1]  # still on the device (another buffer holds it)
        copy = jax.device_put(arr, self.device)
        self.device_copy[id(arr)] = (arr, copy)
        self.host_copy[id(copy)] = (copy, arr)
        return copy

    def copy(self, buf: Buffers, change: CopyEffect) -> None:
        """Carry out one copy effect on ``buf`` (:func:`~jax_exec.execute.copies.carry_out`);
        a host-memory variant's residuals in host memory already stay where they are."""
        late = self.late.get(change.buffer, frozenset())

        def moved(to: Callable) -> Callable:
            return lambda arrays: {k: a if k in late else to(buf, a) for k, a in arrays.items()}

        carry_out(change, buf.table, moved(self.to_host), moved(self.to_device), buf.drop)


def step_result(
    model: BlockModel, call: tuple, gv: dict, grads: dict, results: dict, loss: Any,
    meter: OpMeter, ops: tuple,
) -> RunResult:  # fmt: skip
    """The :class:`RunResult` of a step once its ops ran (``meter`` stopped, the
    buffers dropped): gradients per parameter leaf (the slices of a scanned stack's
    parameters summed into their stack), ``aux`` and the state after the step from the
    blocks' results, and what ``meter`` recorded."""
    params, rest, args = call
    program = model.program
    for vid, (src, i) in sorted(program.derived.items(), reverse=True):
        if vid in grads:  # a slice of a stacked parameter: into its stack
            base = grads.get(src, jnp.zeros(program.avals[src].shape, program.avals[src].dtype))
            grads[src] = base.at[i].add(grads.pop(vid))
    grad_leaves = [
        grads[v] if v in grads else jnp.zeros(program.avals[v].shape, program.avals[v].dtype)
        for v in program.param_ids
    ]
    if program.grad_shardings:  # a sharded model's: where the plain step puts them
        pairs = zip(grad_leaves, program.param_ids, strict=True)
        grad_leaves = [place(g, program.grad_shardings[v]) for g, v in pairs]
    aux, new_state = program.outputs(loss, gv, results)
    grad_tree = jax.tree_util.tree_unflatten(program.treedefs[0], grad_leaves)
    return RunResult(
        loss=loss,
        aux=aux if model.traced.has_aux else None,
        grads=grad_tree,
        new_state=new_state,
        **meter.figures(),
        param_bytes=tree_bytes(params),
        grad_bytes=tree_bytes(grad_leaves),
        batch_bytes=tree_bytes(tuple(args)),
        output_bytes=tree_bytes((aux, new_state)),
        ops=tuple(ops),
    )
