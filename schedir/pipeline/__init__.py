"""The pipeline kind: a chain cut into intervals over several devices, inference
streams and training schedules (GPipe, 1F1B, interleaved, zero-bubble, V-shape; split
backwards), their per-device op lists and the simulator that runs them
(docs/pipelines.md). Drawn with one lane per device and per link. The steady-state
models of mappings are :mod:`schedir.steady`; dynamic runs, :mod:`schedir.dynamic`."""

from schedir import kind as _kind
from schedir.pipeline.baselines import gpipe_ops, one_f_one_b_ops
from schedir.pipeline.ops import Bwd, Effect, Fwd, Recv, Send, Wgt, effect
from schedir.pipeline.problem import (
    Interval,
    Mapping,
    PipelineProblem,
    capacity,
    link_time,
    working_set,
)
from schedir.pipeline.schedule import ChunkPlan, PipelineSchedule, expand
from schedir.pipeline.simulate import (
    Noise,
    PipelineTrace,
    judge_pipeline,
    pipeline_lanes,
    pipeline_memory,
    simulate_pipeline,
)
from schedir.platform import Platform

KIND = _kind.register(
    _kind.Kind(
        name="pipeline",
        problem=PipelineProblem,
        schedules=(PipelineSchedule,),
        formats={
            "schedir.pipeline": PipelineProblem,
            PipelineSchedule.FORMAT: PipelineSchedule,
            "schedir.platform": Platform,
        },
        simulate=simulate_pipeline,
        judge=judge_pipeline,
        lanes=pipeline_lanes,
        budget="optional",  # the devices' memories bound the peaks; a budget bounds all
        memory=pipeline_memory,
    )
)

__all__ = [
    "KIND",
    "Bwd",
    "ChunkPlan",
    "Effect",
    "Fwd",
    "Interval",
    "Mapping",
    "Noise",
    "PipelineProblem",
    "PipelineSchedule",
    "PipelineTrace",
    "Recv",
    "Send",
    "Wgt",
    "capacity",
    "effect",
    "expand",
    "gpipe_ops",
    "link_time",
    "one_f_one_b_ops",
    "simulate_pipeline",
    "working_set",
]
