"""Profile a DAG of Flax NNX modules and a loss into a ``schedir.Graph`` (docs/graphs.md).

A model is a dict ``name -> (module, [input names])`` in topological order: each module
is called with the arrays of its inputs (model inputs or earlier nodes), in order, and
returns one array; the last node's output goes to ``loss_fn(out, y)``. The graph has
the layout of :func:`schedir.graph.forward_backward_graph`, with residual nodes as in
:func:`schedir.chain_to_graph` (exact rules in ``docs/graphs.md``, section "JAX
models as graphs"):

- one ``input`` node per model input (bytes of the array);
- per module v, in order: ``R{v}`` when v's ``jax.vjp`` has *new* residuals (not an
  input, a parameter or the output: the residual arrays themselves, from
  :mod:`jax_exec.kernels`' classification; its kernel runs the forward again and keeps
  them), then ``v`` (forward; its output);
- ``loss`` (reads the last node; its output is the gradient of the model output);
- per module v, in reverse order: ``B{v}`` (reads ``B{u}`` for every module u that
  reads v, or ``loss`` for the last node; v; ``R{v}``; v's inputs). Its output is the
  gradients of v's inputs, one array per input, in order: the gradient of v is the
  sum, computed inside ``B{v}``'s kernel, of v's slots in its users' outputs.

Every node is one compiled kernel (:func:`jax_exec.graph.kernels.node_kernels`), which the runtime
(:func:`jax_exec.graph.runtime.run_graph`) runs for ``Compute``; sizes are the exact bytes
of the arrays it returns, ``tmp`` its ``memory_analysis()`` temporary bytes, ``cost``
the median time of its ``Compute`` in the runtime or its FLOPs / ``flops_per_second``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.graph.kernels import (  # noqa: F401 - _KERNELS, dag_kernels: kept importable here
    _KERNELS,
    DagKernels,
    backward_name,
    dag_kernels,
    layout_spec,
    residual_name,
    spec_graph,
)
from jax_exec.graph.runtime import execute
from jax_exec.profile import check_timing, flops_seconds
from schedir import Compute, Graph


def profile_graph(
    nodes: Mapping[str, Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    inputs: Mapping[str, Any],
    y: Any,
    *,
    timing: str = "measure",
    flops_per_second: float = 1e10,
    repeats: int = 7,
) -> Graph:
    """Profile a DAG model into a ``schedir.Graph`` (layout: module docstring).

    Args:
        nodes: ``name -> (nnx.Module, [input names])`` in topological order.
        loss_fn: ``loss_fn(out, y)`` -> scalar, ``out`` the last node's output.
        inputs: ``name -> array``, the model inputs (their shapes fix the sizes).
        y: the target.
        timing: ``"measure"`` (per node, the median of its ``Compute`` in the op-by-op
            runtime over ``repeats`` runs of every node once, after a warm-up run;
            seconds) or ``"flops"`` (``cost_analysis()`` FLOPs / ``flops_per_second``).

    Raises:
        TypeError / ValueError: a malformed model, a node output that is not one array,
            a loss that is not a scalar, an unknown ``timing``, ``repeats`` < 1.
    """
    check_timing(timing, flops_per_second, repeats)
    dk = dag_kernels(nodes, loss_fn, inputs, y)
    spec = layout_spec(dk, list(inputs))
    cost: dict[str, float] = {n: 0.0 for n in inputs}
    if timing == "flops":
        for node in dk.dag:
            k = dk.kernels[node.name]
            cost[node.name] = flops_seconds(k.fwd, flops_per_second)
            cost[residual_name(node.name)] = flops_seconds(k.res, flops_per_second)
            cost[backward_name(node.name)] = flops_seconds(k.bwd, flops_per_second)
        cost["loss"] = flops_seconds(dk.loss, flops_per_second)
    else:
        cost.update(_measure(dk, spec, inputs, y, repeats))
    return spec_graph(spec, cost)


def _measure(
    dk: DagKernels, spec: list[dict], inputs: Mapping[str, Any], y: Any, repeats: int
) -> dict[str, float]:
    """Seconds per node: the median, over ``repeats`` runs of every node once in order
    (after one warm-up run), of its ``Compute`` as the runtime executes it (dispatch,
    kernel, wait), so that a schedule's makespan predicts the runtime's time."""
    graph = spec_graph(spec, {s["name"]: 0.0 for s in spec})
    ops = tuple(Compute(i) for i in graph.computed)
    arrays = {n: jnp.asarray(a) for n, a in inputs.items()}
    times: dict[int, list[float]] = {i: [] for i in graph.computed}
    for run in range(repeats + 1):
        result = execute(dk, graph, ops, arrays, y)
        if run:
            for op, t in zip(ops, result.op_times, strict=True):
                times[op.node].append(t)
    return {graph.nodes[i].name: statistics.median(t) for i, t in times.items()}
