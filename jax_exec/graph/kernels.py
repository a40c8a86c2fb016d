"""The kernels and the graph layout of a DAG model (docs/graphs.md, "JAX models as
graphs"): what the profiler (:mod:`jax_exec.graph.profile`) and the runtime
(:mod:`jax_exec.graph.runtime`) share. Node kernels come from the one builder,
:func:`jax_exec.kernels.node_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from jax_exec.graph.model import DagNode, as_dag, users_of
from jax_exec.kernels import GRAPH_KERNELS, NodeKernels, loss_kernel
from jax_exec.kernels import node_kernels as build_kernels
from jax_exec.program.compiled import Kernel
from jax_exec.stages.split import as_spec, spec_bytes
from schedir import Graph, Node

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


def layout_spec(dk: DagKernels, input_names: Sequence[str]) -> list[dict]:
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


def spec_graph(spec: list[dict], cost: Mapping[str, float]) -> Graph:
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
    spec = layout_spec(dk, input_names)
    return spec_graph(spec, {s["name"]: 0.0 for s in spec})


def check_graph(graph: Graph, dk: DagKernels, input_names: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``graph`` is the profile of this model and batch shape
    (same nodes, kinds, edges, sizes and tmp bytes; costs may differ)."""
    spec = layout_spec(dk, input_names)
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
