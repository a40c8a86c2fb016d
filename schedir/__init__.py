"""schedir: the scheduling IR. Problems, ops, schedules, the simulator, JSON I/O.

Pure Python + numpy: never imports jax, flax or cvxpy, so any executor can consume
the schedules.
"""

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

from schedir import kind
from schedir.chain.discretize import Discretized, discretize
from schedir.chain.ops import B, F_all, F_ck, F_n, Loss, parse_op
from schedir.chain.problem import Chain
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.graph.convert import chain_ops_to_graph, chain_to_graph
from schedir.graph.ops import Compute, Free, parse_graph_op
from schedir.graph.problem import Graph, Node, build_graph
from schedir.graph.simulate import GraphSchedule, simulate_graph
from schedir.io import from_dict, load, save
from schedir.offload.ops import Evict, Offload, OffloadSchedule, Prefetch, Wait, parse_offload_op
from schedir.offload.problem import OffloadProblem
from schedir.offload.simulate import OffloadTrace, simulate_offload
from schedir.platform import PRESETS, CopyEngine, Device, Link, Platform
from schedir.schedule import Schedule
from schedir.simulate import Trace, op_time, simulate, simulate_chain

__all__ = [
    "kind",
    "PRESETS",
    "CopyEngine",
    "Device",
    "Link",
    "Platform",
    "B",
    "Chain",
    "Discretized",
    "F_all",
    "F_ck",
    "F_n",
    "InvalidProblem",
    "InvalidSchedule",
    "Loss",
    "Schedule",
    "Trace",
    "discretize",
    "from_dict",
    "load",
    "op_time",
    "parse_op",
    "save",
    "simulate",
    "simulate_chain",
    "Compute",
    "Free",
    "Graph",
    "GraphSchedule",
    "Node",
    "build_graph",
    "chain_ops_to_graph",
    "chain_to_graph",
    "parse_graph_op",
    "simulate_graph",
    "Evict",
    "Offload",
    "OffloadProblem",
    "OffloadSchedule",
    "OffloadTrace",
    "Prefetch",
    "Wait",
    "parse_offload_op",
    "simulate_offload",
]

# Several devices: pipelines, steady state, dynamic runs (docs/pipelines.md).
# The kinds register themselves (schedir.kind) when their subpackages are imported;
# the block-chain kind of the automatic planner too.
import schedir.blocks  # noqa: E402, F401
from schedir.dynamic import Task, TaskGraph, pipeline_graph, simulate_dynamic  # noqa: E402
from schedir.pipeline.baselines import gpipe_ops, one_f_one_b_ops
from schedir.pipeline.ops import Bwd, Fwd, Recv, Send, Wgt
from schedir.pipeline.problem import Interval, Mapping, PipelineProblem  # noqa: E402
from schedir.pipeline.schedule import PipelineSchedule
from schedir.pipeline.simulate import Noise, PipelineTrace, simulate_pipeline  # noqa: E402
from schedir.steady import (  # noqa: E402
    MasterWorker,
    PeriodReport,
    SteadyState,
    evaluate,
    inference_pattern,
    training_period,
)

__all__ += [
    "Bwd",
    "Fwd",
    "Interval",
    "Mapping",
    "MasterWorker",
    "Noise",
    "PeriodReport",
    "PipelineProblem",
    "PipelineSchedule",
    "PipelineTrace",
    "Recv",
    "Send",
    "SteadyState",
    "Task",
    "TaskGraph",
    "Wgt",
    "evaluate",
    "gpipe_ops",
    "inference_pattern",
    "one_f_one_b_ops",
    "pipeline_graph",
    "simulate_dynamic",
    "simulate_pipeline",
    "training_period",
]
