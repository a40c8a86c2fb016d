"""Graph schedules of a block model, op by op with measured memory (docs/auto.md,
"Graph methods").

A graph method (``checkmate_milp``, ``dtr``, ...) schedules the graph of the block
chain (:func:`schedir.blocks.graph.block_graph`). Each node is a buffer of arrays:
``F{k}`` the values block k makes (its ``forward`` kernel), ``R{k}`` its saved
residuals under the option (its ``record`` kernel, whose outputs are dropped),
``loss`` and ``B{k}`` cotangents (the loss kernel; block k's backward phases, which
free nothing: the inputs are nodes, freed by ``Free`` ops). ``Compute`` runs the
node's kernels, ``Free`` deletes its arrays. After every op the runtime measures the
live bytes (distinct arrays) and each compute's need (live bytes right after its
outputs plus its kernel's temporary bytes; for ``R{k}``, its dropped outputs
included): they equal ``simulate_graph``'s ``resident`` and ``op_peak``. The model
state after the step comes from the first forward of each block, and the parameters'
gradients from the first run of each backward node.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from jax_exec.execute.buffers import Buffers
from jax_exec.execute.interpreter import run_backward, step_result
from jax_exec.execute.result import OpMeter, RunResult
from jax_exec.program.model import BlockModel, global_values, through_flags
from schedir import Free, simulate_graph
from schedir.blocks.graph import block_graph


def run_graph_schedule(
    model: BlockModel, schedule: Any, options: tuple[int, ...], params: Any, rest: Any,
    args: tuple,
) -> RunResult:  # fmt: skip
    """Run a graph schedule of ``block_graph(model.problem, options)`` (one save option
    per block) op by op (module docstring)."""
    graph, where = block_graph(model.problem, options)
    simulate_graph(graph, schedule)  # a valid schedule, or InvalidSchedule
    if model.blocks.cuts[0]:  # pragma: no cover - a traced program's first cut is empty
        raise ValueError("a block model whose first cut holds values has no graph runtime")
    gv = global_values(model, params, rest, args)
    keep = {id(a) for a in gv.values()}
    buf = Buffers(keep)
    results: dict[int, Any] = {}
    grads: dict[int, Any] = {}
    forwarded, differentiated = set(), set()
    loss = None
    meter = OpMeter(buf.nbytes())

    def node(i: int) -> dict:
        return buf.table["node", i]

    def value(v: int) -> Any:  # node keys are the problem's value ids
        return node(where.maker[model.value_index[v]])[v]

    def inputs(k: int) -> tuple:
        lay = model.layouts[k]
        p = tuple(gv[v] for v in lay.params)
        g = tuple(gv[v] for v in lay.others)
        return p, g, tuple(value(v) for v in lay.ins)

    def add_grads(i: int, k: int, d_p: tuple) -> None:
        if i in differentiated:  # a backward run again makes the same gradients
            return
        for vid, d in zip(model.layouts[k].params, d_p, strict=True):
            grads[vid] = d if vid not in grads else grads[vid] + d

    def keep_results(k: int, res: tuple) -> None:
        if k in forwarded:  # the state after the step comes from the first forward
            for r in res:
                r.delete()
            return
        forwarded.add(k)
        results.update(zip(model.layouts[k].results, res, strict=True))
        keep.update(id(r) for r in res)

    def grad_of(v: int, after: int) -> Any:
        r = next((j for j in range(after, model.length) if v in model.blocks.blocks[j].ins),
                 model.length)  # fmt: skip
        return node(where.grad[model.value_index[v], r])[v]

    for op in schedule.ops:
        start = time.perf_counter()
        i = op.node
        temp = 0
        if isinstance(op, Free):
            buf.drop(("node", i))
            need = buf.nbytes()
        else:
            role, k = where.role(i)
            lay = model.layouts[k]
            if role == "fwd":
                kernel = model.kernel("forward", k)
                outs, res = kernel.call(*inputs(k))
                jax.block_until_ready(outs)
                keep_results(k, res)
                buf.table["node", i] = dict(zip(lay.outs, outs, strict=True))
                temp = kernel.temp_bytes
                need = buf.nbytes() + temp
            elif role == "res":
                kernel = model.kernel("record", k, where.options[k])
                outs, res, new = kernel.call(*inputs(k))
                jax.block_until_ready(new)
                keep_results(k, res)
                buf.table["node", i] = {("new", j): a for j, a in enumerate(new)}
                temp = kernel.temp_bytes
                need = buf.nbytes() + sum(int(a.nbytes) for a in outs) + temp
                for a in outs:  # the outputs are F{k}'s; here they are temporaries
                    a.delete()
            elif role == "loss":
                kernel = model.kernel("loss", k)
                loss, res, d_p, d_x = kernel.call(*inputs(k))
                jax.block_until_ready(d_x)
                results.update(zip(lay.results, res, strict=True))
                keep.update(id(r) for r in res)
                add_grads(i, k, d_p)
                differentiated.add(i)
                active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
                buf.table["node", i] = dict(zip(active, d_x, strict=True))
                temp = kernel.temp_bytes
                need = buf.nbytes() + temp
            else:  # "bwd"
                o = where.options[k]
                p, g, x = inputs(k)
                made = node(where.fwd[k])
                outs = tuple(made[v] for v in lay.outs)
                res = tuple(results[v] for v in lay.results)
                saved = node(where.res[k]) if where.res[k] is not None else {}
                new = tuple(saved[("new", j)] for j in range(len(model.functions(k, o).recipe.new)))
                d_outs = tuple(
                    grad_of(v, k + 1) for v, a in zip(lay.outs, lay.act_out, strict=True) if a
                )
                active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
                flags = through_flags(model, k)
                through = tuple(
                    grad_of(v, k + 1) if f else None for v, f in zip(active, flags, strict=True)
                )
                pb, kernels = model.backward_kernels(k, o)
                d_p, d_x, need, temp = run_backward(
                    buf, pb, kernels, (p, g, x, outs, res, new, d_outs, through), None, k
                )
                add_grads(i, k, d_p)
                differentiated.add(i)
                buf.table["node", i] = dict(zip(active, d_x, strict=True))
                buf.drop(("phase", k))
        meter.record(time.perf_counter() - start, temp, need, buf.nbytes())
    call = (params, rest, args)
    return step_result(model, call, gv, grads, results, loss, meter, buf, schedule.ops)
