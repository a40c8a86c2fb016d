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

Every node is one compiled kernel (:func:`node_kernels`), which the runtime
(:func:`jax_exec.graph.runtime.run_graph`) runs for ``Compute``; sizes are the exact bytes
of the arrays it returns, ``tmp`` its ``memory_analysis()`` temporary bytes, ``cost``
the median time of its ``Compute`` in the runtime or its FLOPs / ``flops_per_second``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.graph.model import DagNode, as_dag, users_of
from jax_exec.kernels import GRAPH_KERNELS, Kernel, NodeKernels, loss_kernel
from jax_exec.kernels import node_kernels as build_kernels
from jax_exec.profile import check_timing, flops_seconds
from jax_exec.stages import as_spec, spec_bytes
from schedir import Compute, Graph, Node

# ----------------------------------------------------------------------- kernels


# Graph nodes launch ``fwd``, ``res`` and ``bwd`` (jax_exec.kernels); their own cache,
# so that every entry holds the three kernels the runtime launches.
_KERNELS: dict[tuple, NodeKernels] = {}


def node_kernels(node: DagNode, in_specs: tuple, cots: int) -> NodeKernels:
    """Compile (or fetch from the cache) the kernels of ``node`` for these input shapes
    and ``cots`` cotangents (users of its output; 1 for the last node)."""
    return build_kernels(node, in_specs, cots, GRAPH_KERNELS, _KERNELS)


@dataclass(frozen=True)
class DagKernels:
    """Everything the profiler and the runtime share for one model and batch shape.

    Attributes:
        dag: the modules in pure form.
        specs: shape and dtype of every input and node output, by name.
        kernels: per module name, its :class:`NodeKernels`.
        users: per name, the modules reading it.
        loss: the compiled ``(out, y) -> (loss, d_out)``.
    """

    dag: list[DagNode]
    specs: dict[str, jax.ShapeDtypeStruct]
    kernels: dict[str, NodeKernels]
    users: dict[str, list[str]]
    loss: Kernel


def dag_kernels(
    nodes: Mapping[str, Any], loss_fn: Callable, inputs: Mapping[str, Any], y: Any
) -> DagKernels:
    """Kernels of every module and of the loss (cached by computation and shapes)."""
    if not isinstance(inputs, Mapping) or not inputs:
        raise TypeError("inputs must be a non-empty dict name -> array")
    dag = as_dag(nodes, list(inputs))
    specs = {n: as_spec(f"input {n!r}", a) for n, a in inputs.items()}
    users = users_of(dag)
    kernels = {}
    for node in dag:
        cots = max(1, len(users[node.name]))
        kernels[node.name] = node_kernels(node, tuple(specs[i] for i in node.inputs), cots)
        specs[node.name] = kernels[node.name].functions.out
    loss = loss_kernel(loss_fn, specs[dag[-1].name], y)
    return DagKernels(dag, specs, kernels, users, loss)


# ------------------------------------------------------------------ graph layout


def residual_name(name: str) -> str:
    return f"R{name}"


def backward_name(name: str) -> str:
    return f"B{name}"


def _layout(dk: DagKernels, input_names: Sequence[str]) -> list[dict]:
    """The graph nodes (as dicts, inputs by name) without costs."""
    spec: list[dict] = []
    size = {n: spec_bytes(s) for n, s in dk.specs.items()}
    for n in input_names:
        spec.append({"name": n, "kind": "input", "size": size[n], "tmp": 0, "inputs": []})
    for node in dk.dag:
        k = dk.kernels[node.name]
        if k.functions.recipe.new:  # before v: computing R{v} then v peaks lowest
            spec.append(
                {
                    "name": residual_name(node.name),
                    "kind": "forward",
                    "size": k.functions.recipe.new_bytes,
                    "tmp": k.res.temp_bytes,
                    "inputs": list(node.inputs),
                }
            )
        spec.append(
            {
                "name": node.name,
                "kind": "forward",
                "size": size[node.name],
                "tmp": k.fwd.temp_bytes,
                "inputs": list(node.inputs),
            }
        )
    last = dk.dag[-1].name
    spec.append(
        {"name": "loss", "kind": "backward", "size": size[last], "tmp": dk.loss.temp_bytes,
         "inputs": [last]}
    )  # fmt: skip
    for node in reversed(dk.dag):
        k = dk.kernels[node.name]
        grads = [backward_name(u) for u in dk.users[node.name]] or ["loss"]
        res = [residual_name(node.name)] if k.functions.recipe.new else []
        spec.append(
            {
                "name": backward_name(node.name),
                "kind": "backward",
                "size": sum(size[i] for i in node.inputs),
                "tmp": k.bwd.temp_bytes,
                "inputs": grads + [node.name] + res + list(node.inputs),
            }
        )
    return spec


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
    spec = _layout(dk, list(inputs))
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
    return _graph(spec, cost)


def _measure(
    dk: DagKernels, spec: list[dict], inputs: Mapping[str, Any], y: Any, repeats: int
) -> dict[str, float]:
    """Seconds per node: the median, over ``repeats`` runs of every node once in order
    (after one warm-up run), of its ``Compute`` as the runtime executes it (dispatch,
    kernel, wait), so that a schedule's makespan predicts the runtime's time."""
    from jax_exec.graph.runtime import execute  # the runtime imports this module

    graph = _graph(spec, {s["name"]: 0.0 for s in spec})
    ops = tuple(Compute(i) for i in graph.computed)
    arrays = {n: jnp.asarray(a) for n, a in inputs.items()}
    times: dict[int, list[float]] = {i: [] for i in graph.computed}
    for run in range(repeats + 1):
        result = execute(dk, graph, ops, arrays, y)
        if run:
            for op, t in zip(ops, result.op_times, strict=True):
                times[op.node].append(t)
    return {graph.nodes[i].name: statistics.median(t) for i, t in times.items()}


def _graph(spec: list[dict], cost: Mapping[str, float]) -> Graph:
    index = {s["name"]: i for i, s in enumerate(spec)}
    if len(index) != len(spec):
        names = [s["name"] for s in spec]
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"graph node names {dup} clash (rename the modules or inputs)")
    return Graph(
        tuple(
            Node(
                name=s["name"],
                cost=float(cost[s["name"]]),
                size=s["size"],
                inputs=tuple(index[i] for i in s["inputs"]),
                kind=s["kind"],
                tmp=s["tmp"],
            )
            for s in spec
        )
    )


def layout_graph(dk: DagKernels, input_names: Sequence[str]) -> Graph:
    """The graph of this model and batch shape with every cost 0 (the runtime needs only
    the layout and the bytes)."""
    spec = _layout(dk, input_names)
    return _graph(spec, {s["name"]: 0.0 for s in spec})


def check_graph(graph: Graph, dk: DagKernels, input_names: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``graph`` is the profile of this model and batch shape
    (same nodes, kinds, edges, sizes and tmp bytes; costs may differ)."""
    spec = _layout(dk, input_names)
    names = [n.name for n in graph.nodes]
    if names != [s["name"] for s in spec]:
        raise ValueError(
            f"the graph's nodes {names[:6]}... are not those of this model "
            f"{[s['name'] for s in spec][:6]}...: profile the model with profile_graph"
        )
    for node, s in zip(graph.nodes, spec, strict=True):
        ins = [graph.nodes[j].name for j in node.inputs]
        got = (node.kind, node.size, node.tmp, ins)
        want = (s["kind"], s["size"], s["tmp"], s["inputs"])
        if got != want:
            raise ValueError(
                f"graph node {node.name}: (kind, size, tmp, inputs) = {got}, but this model "
                f"and batch give {want}: profile the model with profile_graph"
            )
