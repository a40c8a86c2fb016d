"""The graph kind (Checkmate's model): nodes in topological order, each with a cost,
an output size and its inputs; ``Compute``/``Free`` schedules (docs/graphs.md)."""

from schedir import kind as _kind
from schedir.graph.convert import (
    ChainNodes,
    chain_nodes,
    chain_ops_to_graph,
    chain_to_graph,
    dropped_recorded_inputs,
)
from schedir.graph.generators import forward_backward_graph, skip_graph
from schedir.graph.ops import Compute, Effect, Free, effect, parse_graph_op
from schedir.graph.problem import Graph, Node, build_graph
from schedir.graph.simulate import GraphSchedule, graph_lanes, simulate_graph

KIND = _kind.register(
    _kind.Kind(
        name="graph",
        problem=Graph,
        schedules=(GraphSchedule,),
        formats={"schedir.graph": Graph, GraphSchedule.FORMAT: GraphSchedule},
        simulate=simulate_graph,
        judge=None,
        lanes=graph_lanes,
        budget="required",
    )
)
_kind.register_reduction("chain", "graph", chain_to_graph)

__all__ = [
    "KIND",
    "ChainNodes",
    "Compute",
    "Effect",
    "Free",
    "Graph",
    "GraphSchedule",
    "Node",
    "build_graph",
    "chain_nodes",
    "chain_ops_to_graph",
    "chain_to_graph",
    "dropped_recorded_inputs",
    "effect",
    "forward_backward_graph",
    "parse_graph_op",
    "simulate_graph",
    "skip_graph",
]
