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
from flax import nnx

from jax_exec.kernels import GRAPH_KERNELS, Kernel, NodeKernels, loss_kernel
from jax_exec.kernels import node_kernels as build_kernels
from jax_exec.stages import as_spec, pure_apply, spec_bytes
from schedir import Compute, Graph, Node

TIMINGS = ("measure", "flops")


# ------------------------------------------------------------------- the DAG model


@dataclass(frozen=True)
class DagNode:
    """One module of a DAG model in pure form.

    Attributes:
        name: the node's name (key of the ``nodes`` dict).
        inputs: names of the arrays it is called with, in order.
        params: trainable parameters (``nnx.State`` of the ``nnx.Param``s).
        rest: other state, passed unchanged.
        apply: ``(params, rest, *inputs) -> output``, pure.
        key: hashable identity of the computation (graph definition).
    """

    name: str
    inputs: tuple[str, ...]
    params: Any
    rest: Any
    apply: Callable[..., jax.Array]
    key: Any


def as_dag(nodes: Mapping[str, Any], input_names: Sequence[str]) -> list[DagNode]:
    """Check ``nodes`` (``name -> (module, [input names])``) and give them in pure form.

    Raises:
        TypeError: not a dict of ``(nnx.Module, list of names)`` pairs.
        ValueError: empty model, unknown / repeated / later input names, a name used
            twice, or a node other than the last one whose output nobody reads.
    """
    if not isinstance(nodes, Mapping):
        raise TypeError(
            f"nodes must be a dict name -> (module, inputs), got {type(nodes).__name__}"
        )
    if not nodes:
        raise ValueError("nodes is empty: a model needs at least one node")
    known = list(input_names)
    if len(set(known)) != len(known):
        raise ValueError(f"input names {known} repeat a name")
    seen = set(known)
    out: list[DagNode] = []
    for name, entry in nodes.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"node name {name!r}: expected a non-empty str")
        if name in seen:
            raise ValueError(f"node {name!r}: the name is already used (an input or a node)")
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            raise TypeError(f"node {name!r}: expected (module, [input names]), got {entry!r}")
        module, ins = entry
        if not isinstance(module, nnx.Module):
            raise TypeError(f"node {name!r}: expected an nnx.Module, got {type(module).__name__}")
        ins = (ins,) if isinstance(ins, str) else tuple(ins)
        if not ins:
            raise ValueError(f"node {name!r} has no inputs")
        if len(set(ins)) != len(ins):
            raise ValueError(f"node {name!r}: inputs {list(ins)} repeat a name")
        for i in ins:
            if i not in seen:
                raise ValueError(
                    f"node {name!r}: unknown input {i!r} (inputs must be model inputs or "
                    f"earlier nodes; nodes are given in topological order)"
                )
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        # pure_apply refuses a module that changes its state while running.
        apply = pure_apply(name, graphdef)
        out.append(DagNode(name, ins, params, rest, apply, ("nnx", graphdef, len(ins))))
        seen.add(name)
    _refuse_shared_params(out)
    read = {i for node in out for i in node.inputs}
    dead = [node.name for node in out[:-1] if node.name not in read]
    if dead:
        raise ValueError(
            f"node(s) {dead} are read by no node and are not the last node: only the last "
            f"node's output goes to the loss"
        )
    return out


def _refuse_shared_params(dag: Sequence[DagNode]) -> None:
    """A parameter read by two nodes would get one partial gradient per node: refuse it."""
    owner: dict[int, str] = {}
    for node in dag:
        for leaf in jax.tree_util.tree_leaves(node.params, is_leaf=_is_variable):
            first = owner.setdefault(id(leaf), node.name)
            if first != node.name:
                raise TypeError(
                    f"nodes {first!r} and {node.name!r} share a parameter (tied weights): a "
                    f"DAG model gives one parameter pytree per node, which would train the "
                    f"copies apart; tie weights inside one node's module"
                )


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def users_of(dag: Sequence[DagNode]) -> dict[str, list[str]]:
    """``name -> modules that read it``, in model order (inputs and nodes)."""
    users: dict[str, list[str]] = {}
    for node in dag:
        users.setdefault(node.name, [])
        for i in node.inputs:
            users.setdefault(i, []).append(node.name)
    return users


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
    if timing not in TIMINGS:
        raise ValueError(f"timing = {timing!r}: expected one of {', '.join(TIMINGS)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats = {repeats!r}: expected an int >= 1")
    if not flops_per_second > 0:
        raise ValueError(f"flops_per_second = {flops_per_second!r}: expected a positive rate")
    dk = dag_kernels(nodes, loss_fn, inputs, y)
    spec = _layout(dk, list(inputs))
    cost: dict[str, float] = {n: 0.0 for n in inputs}
    if timing == "flops":
        for node in dk.dag:
            k = dk.kernels[node.name]
            cost[node.name] = k.fwd.flops / flops_per_second
            cost[residual_name(node.name)] = k.res.flops / flops_per_second
            cost[backward_name(node.name)] = k.bwd.flops / flops_per_second
        cost["loss"] = dk.loss.flops / flops_per_second
    else:
        cost.update(_measure(dk, spec, inputs, y, repeats))
    return _graph(spec, cost)


def _measure(
    dk: DagKernels, spec: list[dict], inputs: Mapping[str, Any], y: Any, repeats: int
) -> dict[str, float]:
    """Seconds per node: the median, over ``repeats`` runs of every node once in order
    (after one warm-up run), of its ``Compute`` as the runtime executes it (dispatch,
    kernel, wait), so that a schedule's makespan predicts the runtime's time."""
    from jax_exec.graph.runtime import execute  # graph_run imports this module

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


# ------------------------------------------------------------------ plain autodiff


def dag_params(nodes: Mapping[str, Any]) -> dict[str, Any]:
    """``name -> nnx.State`` of each module's parameters (the form of the gradients)."""
    return {n: nnx.split(m, nnx.Param, ...)[1] for n, (m, _) in nodes.items()}


def dag_loss(
    nodes: Mapping[str, Any], loss_fn: Callable[[jax.Array, Any], jax.Array]
) -> Callable[[dict, Mapping[str, Any], Any], jax.Array]:
    """``loss(params, inputs, y)``: the DAG model and its loss as one pure function
    (``params`` as :func:`dag_params` gives them); ``jax.value_and_grad`` of it is the
    reference the runtime's gradients equal."""
    names = list(nodes)

    def loss(params: dict, inputs: Mapping[str, Any], y: Any) -> jax.Array:
        dag = as_dag(nodes, list(inputs))
        vals = dict(inputs)
        for node in dag:
            vals[node.name] = node.apply(
                params[node.name], node.rest, *(vals[i] for i in node.inputs)
            )
        return loss_fn(vals[names[-1]], y)

    return loss


# --------------------------------------------------------------- an example model


class Add(nnx.Module):
    """``a + b`` (no parameters): a skip connection."""

    def __call__(self, a: jax.Array, b: jax.Array) -> jax.Array:
        return a + b


class Concat(nnx.Module):
    """Concatenation on the last axis (no parameters): a U-Net style merge."""

    def __call__(self, *xs: jax.Array) -> jax.Array:
        return jnp.concatenate(xs, axis=-1)


class Block(nnx.Module):
    """``W2 gelu(W1 LayerNorm(x))``: an MLP block without its own skip connection."""

    def __init__(self, width: int, hidden: int, out: int | None = None, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, out or width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(self.norm(x))))


def sequential_dag(
    layers: Sequence[nnx.Module], input_name: str = "x"
) -> dict[str, tuple[nnx.Module, list[str]]]:
    """A sequence of modules as a DAG model (``layer0`` reads ``input_name``, ``layer{k}``
    reads ``layer{k-1}``): the chain case. Its profile has the layout of
    :func:`schedir.chain_to_graph` (``layer{k}`` for ``F{k}``, ``Rlayer{k}`` for
    ``R{k}``), with each node's own kernel cost."""
    if not layers:
        raise ValueError("layers is empty: a model needs at least one layer")
    nodes: dict[str, tuple[nnx.Module, list[str]]] = {}
    prev = input_name
    for k, layer in enumerate(layers):
        nodes[f"layer{k}"] = (layer, [prev])
        prev = f"layer{k}"
    return nodes


def residual_dag(
    depth: int, width: int, hidden: int, in_dim: int, out_dim: int, *, seed: int = 0
) -> dict[str, tuple[nnx.Module, list[str]]]:
    """A residual MLP as a DAG, with a U-Net style long skip (model input ``"x"``).

    ``embed`` = Linear(x); then per block i: ``block{i}`` = Block(h), ``add{i}`` =
    h + block{i} (h: the previous add, or embed); then ``cat`` = [h, embed] (the long
    skip from the embedding) and ``head`` = Linear(cat). Embed has three readers, the
    adds two: their gradients are accumulated from several backward nodes.
    """
    rngs = nnx.Rngs(seed)
    nodes: dict[str, tuple[nnx.Module, list[str]]] = {
        "embed": (nnx.Linear(in_dim, width, rngs=rngs), ["x"])
    }
    h = "embed"
    for i in range(depth):
        nodes[f"block{i}"] = (Block(width, hidden, rngs=rngs), [h])
        nodes[f"add{i}"] = (Add(), [h, f"block{i}"])
        h = f"add{i}"
    nodes["cat"] = (Concat(), [h, "embed"])
    nodes["head"] = (nnx.Linear(2 * width, out_dim, rngs=rngs), ["cat"])
    return nodes
