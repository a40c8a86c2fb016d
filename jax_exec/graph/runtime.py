"""The hand-written DAG front end of the one graph interpreter (docs/graphs.md,
docs/jax_exec.md, "The execution core").

:func:`run_graph` executes the ``Compute``/``Free`` ops of a ``GraphSchedule`` on the
graph :func:`jax_exec.graph.profile.profile_graph` made of a DAG model, through
:func:`jax_exec.execute.graph.run_graph_ops` (which stores, frees and measures). Every
graph node is a buffer of explicit arrays (layout in :mod:`jax_exec.graph.kernels`):

- an input node: the caller's array (never deleted: the runtime does not own it;
  ``Free`` only stops counting it);
- module v: its output; ``R{v}``: the new residuals of v's ``jax.vjp``;
- ``loss``: the gradient of the model output; ``B{v}``: the gradients of v's inputs,
  one array per input. ``B{v}`` sums the gradient of v from its users' outputs inside
  its kernel (the sum is part of the kernel's temporary bytes): there is no separate
  accumulation buffer.

Each ``Compute`` launches exactly one kernel, the node's (``RunResult.op_kernels``:
``"fwd v"``, ``"res v"``, ``"bwd v"``, ``"loss"``; None for a ``Free``), so measured
bytes equal ``simulate_graph(graph, schedule).resident`` and needs its ``op_peak``
exactly; ``profile_graph(timing="measure")`` times nodes through :func:`execute`
itself, so a node's cost is what its ``Compute`` takes here. ``grads`` is a dict
``module name -> nnx.State``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax

from jax_exec.execute.buffers import Buffers
from jax_exec.execute.graph import Computed, node_arrays, run_graph_ops
from jax_exec.execute.result import OpMeter, RunResult, tree_bytes
from jax_exec.graph.kernels import (
    DagKernels,
    backward_name,
    check_graph,
    dag_kernels,
    layout_graph,
    residual_name,
)
from schedir import Graph, GraphSchedule, Schedule


@dataclass
class _Dag:
    """The :class:`jax_exec.execute.graph.GraphProgram` of a DAG model (module
    docstring): node i's arrays are keyed by position."""

    dk: DagKernels
    graph: Graph
    arrays: Mapping[str, jax.Array]
    y: Any

    def __post_init__(self) -> None:
        self.index = {node.name: i for i, node in enumerate(self.graph.nodes)}
        self.dag = {node.name: node for node in self.dk.dag}
        self.grads: dict[str, Any] = {name: None for name in self.dag}
        self.loss: Any = None
        # What Compute(i) launches: (kernel "fwd", "res", "bwd" or "loss", module name)
        self.role: dict[int, tuple[str, str]] = {self.index["loss"]: ("loss", "")}
        for name in self.dag:
            self.role[self.index[name]] = ("fwd", name)
            if residual_name(name) in self.index:
                self.role[self.index[residual_name(name)]] = ("res", name)
            self.role[self.index[backward_name(name)]] = ("bwd", name)

    def inputs(self) -> Mapping[int, Mapping]:
        return {self.index[n]: {0: a} for n, a in self.arrays.items()}

    def _held(self, buf: Buffers, name: str) -> tuple:
        return tuple(node_arrays(buf, self.index[name]).values())

    def compute(self, i: int, buf: Buffers) -> Computed:
        kind, name = self.role[i]
        if kind == "loss":
            self.loss, d = self.dk.loss.call(self._held(buf, self.dk.dag[-1].name)[0], self.y)
            return Computed({0: d}, self.dk.loss.temp_bytes, "loss")
        node, k = self.dag[name], self.dk.kernels[name]
        args = (node.params, node.rest, tuple(self._held(buf, j)[0] for j in node.inputs))
        if kind == "fwd":
            out, kernel = (k.fwd.call(*args),), k.fwd
        elif kind == "res":
            out, kernel = tuple(k.res.call(*args)), k.res
        else:  # "bwd": the gradient of v is the sum of its slots in its users' outputs
            users = self.dk.users[name]
            cots = tuple(
                self._held(buf, backward_name(u))[self.dag[u].inputs.index(name)] for u in users
            ) or self._held(buf, "loss")
            new = self._held(buf, residual_name(name)) if residual_name(name) in self.index else ()
            self.grads[name], d_ins = k.bwd.call(*args, self._held(buf, name)[0], new, cots)
            out, kernel = tuple(d_ins), k.bwd
        return Computed(dict(enumerate(out)), kernel.temp_bytes, f"{kind} {name}")

    def result(self, meter: OpMeter, ops: tuple) -> RunResult:
        return meter.result(
            loss=self.loss,
            grads=self.grads,
            param_bytes=sum(tree_bytes(node.params) for node in self.dk.dag),
            grad_bytes=tree_bytes(list(self.grads.values())),
            batch_bytes=tree_bytes(list(self.arrays.values())) + tree_bytes(self.y),
            ops=ops,
        )


def execute(
    dk: DagKernels, graph: Graph, ops: tuple, arrays: Mapping[str, jax.Array], y: Any
) -> RunResult:
    """Run ``ops`` (valid for ``graph``, the layout of ``dk``'s model) op by op: each
    ``Compute`` launches its node's one kernel and waits for it, each ``Free`` deletes
    the node's arrays; times and live bytes are measured per op."""
    return run_graph_ops(_Dag(dk, graph, arrays, y), graph, ops)


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
    return execute(dk, graph, ops, arrays, y)
