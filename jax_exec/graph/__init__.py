"""DAG models: a dict ``name -> (nnx.Module, [input names])`` profiled into a
:class:`schedir.Graph` and run op by op following a graph schedule (docs/graphs.md)."""

from jax_exec.graph.model import dag_loss, dag_params, sequential_dag
from jax_exec.graph.profile import profile_graph
from jax_exec.graph.runtime import run_graph

__all__ = ["dag_loss", "dag_params", "profile_graph", "run_graph", "sequential_dag"]
