"""The graph kind (Checkmate's model): nodes in topological order, each with a cost,
an output size and its inputs; ``Compute``/``Free`` schedules (docs/graphs.md)."""

from schedir.graph.ops import Compute, Free, parse_graph_op
from schedir.graph.problem import (
    ChainNodes,
    Graph,
    Node,
    build_graph,
    chain_nodes,
    chain_ops_to_graph,
    chain_to_graph,
    dropped_recorded_inputs,
    forward_backward_graph,
    skip_graph,
)
from schedir.graph.simulate import GraphSchedule, simulate_graph

__all__ = [
    "ChainNodes",
    "Compute",
    "Free",
    "Graph",
    "GraphSchedule",
    "Node",
    "build_graph",
    "chain_nodes",
    "chain_ops_to_graph",
    "chain_to_graph",
    "dropped_recorded_inputs",
    "forward_backward_graph",
    "parse_graph_op",
    "simulate_graph",
    "skip_graph",
]
