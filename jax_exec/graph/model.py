"""DAG models: a dict ``name -> (module, [input names])`` in topological order, checked
and put in pure form (docs/graphs.md, "JAX models as graphs").

Each module is called with the arrays of its inputs (model inputs or earlier nodes), in
order, and returns one array; the last node's output goes to ``loss_fn(out, y)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx

from jax_exec.stages.split import pure_apply


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
