"""The pipeline kind: a chain cut into intervals over several devices, inference
streams and 1F1B/GPipe training; steady state and dynamic task graphs
(docs/pipelines.md)."""

from schedir.pipeline.dag import Task, TaskGraph, pipeline_graph, simulate_dynamic
from schedir.pipeline.master_worker import MasterWorker, SteadyState
from schedir.pipeline.ops import (
    Bwd,
    Fwd,
    PipelineSchedule,
    Recv,
    Send,
    gpipe_ops,
    inference_pattern,
    one_f_one_b_ops,
)
from schedir.pipeline.problem import (
    Interval,
    Mapping,
    PeriodReport,
    PipelineProblem,
    buffer_counts,
    evaluate,
    exhaustive,
    training_period,
    working_set,
)
from schedir.pipeline.simulate import Noise, PipelineTrace, simulate_pipeline

__all__ = [
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
    "buffer_counts",
    "evaluate",
    "exhaustive",
    "gpipe_ops",
    "inference_pattern",
    "one_f_one_b_ops",
    "pipeline_graph",
    "simulate_dynamic",
    "simulate_pipeline",
    "training_period",
    "working_set",
]
