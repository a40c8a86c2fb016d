"""The op-by-op runtime for graph schedules (docs/jax_exec.md, runtime path).

:func:`run_graph` executes the ``Compute``/``Free`` ops of a ``GraphSchedule`` on the
graph :func:`jax_exec.graph.profile.profile_graph` made of a DAG model. Every graph
node is a buffer of explicit arrays (layout in :mod:`jax_exec.graph.kernels`):

- an input node: the caller's array (never deleted: the runtime does not own it;
  ``Free`` only stops counting it);
- module v: its output; ``R{v}``: the new residuals of v's ``jax.vjp``;
- ``loss``: the gradient of the model output; ``B{v}``: the gradients of v's inputs,
  one array per input. ``B{v}`` sums the gradient of v from its users' outputs inside
  its kernel (the sum is part of the kernel's temporary bytes): there is no separate
  accumulation buffer.

``Compute`` runs the node's compiled kernel; ``Free`` deletes the node's arrays
(``Array.delete()``). After every op the live bytes of the arrays held are measured
(distinct arrays, ``nbytes``), so they equal ``simulate_graph(graph, schedule)
.resident`` exactly, and each op's measured need (live bytes right after a compute +
its kernel's temporary bytes) equals the simulator's ``op_peak``. Each ``Compute``
launches exactly one kernel, the node's (``GraphRunResult.op_kernels``), and
``profile_graph(timing="measure")`` times nodes through :func:`execute` itself, so a
node's cost is what its ``Compute`` takes here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jax_exec.execute.buffers import Buffers
from jax_exec.execute.result import OpMeter, RunResult, tree_bytes
from jax_exec.graph.kernels import (
    DagKernels,
    backward_name,
    check_graph,
    dag_kernels,
    layout_graph,
    residual_name,
)
from schedir import Compute, Free, Graph, GraphSchedule, Schedule, simulate_graph

# For a graph run ``grads``
# is a dict ``module name -> nnx.State``, bytes are counted over graph node buffers, a
# ``Free`` op's ``op_peak_bytes`` is the live bytes after it (its temporary is 0), and
# ``op_kernels`` gives per op the kernel it launched (None for a ``Free``).


def node_roles(graph: Graph, dk: DagKernels) -> dict[int, tuple[str, str]]:
    """What ``Compute(i)`` launches, per graph node: ``(kernel, module name)`` with
    kernel ``"fwd"``, ``"res"``, ``"bwd"`` or ``"loss"`` (module name "")."""
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    role: dict[int, tuple[str, str]] = {}
    for node in dk.dag:
        role[index[node.name]] = ("fwd", node.name)
        if residual_name(node.name) in index:
            role[index[residual_name(node.name)]] = ("res", node.name)
        role[index[backward_name(node.name)]] = ("bwd", node.name)
    role[index["loss"]] = ("loss", "")
    return role


def execute(
    dk: DagKernels, graph: Graph, ops: tuple, arrays: Mapping[str, jax.Array], y: Any
) -> RunResult:
    """Run ``ops`` (valid for ``graph``, the layout of ``dk``'s model) op by op: each
    ``Compute`` launches its node's one kernel and waits for it, each ``Free`` deletes
    the node's arrays; times and live bytes are measured per op."""
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    dag = {node.name: node for node in dk.dag}
    role = node_roles(graph, dk)
    last = dk.dag[-1].name

    buf = Buffers(keep={id(a) for a in arrays.values()})  # the caller's inputs stay

    def put(i: int, values: tuple) -> None:
        buf.table[i] = dict(enumerate(values))

    def held(i: int) -> tuple:
        return tuple(buf.table[i].values())

    for n, a in arrays.items():
        put(index[n], (a,))
    grads: dict[str, Any] = {name: None for name in dag}
    loss = None
    meter = OpMeter(buf.nbytes(), kernels=True)
    for op in ops:
        start = time.perf_counter()
        i = op.node
        if isinstance(op, Compute):
            kind, name = role[i]
            if kind == "loss":
                loss, d = dk.loss.call(held(index[last])[0], y)
                out: tuple = (d,)
                temp = dk.loss.temp_bytes
            else:
                node, k = dag[name], dk.kernels[name]
                ins = tuple(held(index[j])[0] for j in node.inputs)
                args = (node.params, node.rest, ins)
                if kind == "fwd":
                    out, temp = (k.fwd.call(*args),), k.fwd.temp_bytes
                elif kind == "res":
                    out, temp = tuple(k.res.call(*args)), k.res.temp_bytes
                else:
                    users = dk.users[name]
                    if users:
                        cots = tuple(
                            held(index[backward_name(u)])[dag[u].inputs.index(name)] for u in users
                        )
                    else:
                        cots = held(index["loss"])
                    r = index.get(residual_name(name))
                    new = held(r) if r is not None else ()
                    grads[name], d_ins = k.bwd.call(*args, held(index[name])[0], new, cots)
                    out, temp = tuple(d_ins), k.bwd.temp_bytes
            jax.block_until_ready(out)
            seconds, launched = time.perf_counter() - start, f"{kind} {name}" if name else kind
            put(i, tuple(out))
            need = buf.nbytes() + temp
        elif isinstance(op, Free):
            buf.drop(i)
            seconds, launched, temp = time.perf_counter() - start, None, 0
            need = buf.nbytes()
        else:  # pragma: no cover - GraphSchedule rejects foreign ops
            raise TypeError(f"not a graph op: {op!r}")
        meter.record(seconds, temp, need, buf.nbytes(), kernel=launched)
    meter.stop()
    buf.clear()  # what the schedule left (gradients of the inputs): the caller has grads

    return meter.result(
        loss=loss,
        grads=grads,
        param_bytes=sum(tree_bytes(node.params) for node in dk.dag),
        grad_bytes=tree_bytes(list(grads.values())),
        batch_bytes=tree_bytes(list(arrays.values())) + tree_bytes(y),
        ops=ops,
    )


def run_graph(
    nodes: Mapping[str, Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    graph: Graph | None,
    schedule: GraphSchedule | Schedule | Any,
    inputs: Mapping[str, Any],
    y: Any,
) -> RunResult:
    """Run one training step of a DAG model op by op following a graph schedule.

    Args:
        nodes: ``name -> (nnx.Module, [input names])``, as for ``profile_graph``.
        loss_fn: ``loss_fn(out, y)`` -> scalar.
        graph: ``profile_graph(nodes, loss_fn, inputs, y)`` (costs may differ), or None:
            the same layout, built here (``jax_exec.run`` passes None).
        schedule: a ``GraphSchedule`` or a sequence of ``Compute``/``Free`` ops (or their
            printed forms) for ``graph``.
        inputs: ``name -> array``; y: the target.

    Raises:
        schedir.InvalidSchedule: the simulator rejects the schedule on ``graph``.
        ValueError: ``graph`` is not the profile of this model and batch shape.
    """
    ops = (
        schedule.ops if isinstance(schedule, GraphSchedule) else GraphSchedule(tuple(schedule)).ops
    )
    arrays = {n: jax.numpy.asarray(a) for n, a in inputs.items()}
    dk = dag_kernels(nodes, loss_fn, arrays, y)
    if graph is None:
        graph = layout_graph(dk, list(arrays))
    else:
        check_graph(graph, dk, list(arrays))
    simulate_graph(graph, ops)  # every op valid, the step complete, or a clear error
    return execute(dk, graph, ops, arrays, y)
