"""Several devices (docs/pipelines.md, docs/dynamic_training.md, docs/device_memory.md):
pipelines of a stage list over devices (MPMD per interval, SPMD over a mesh), pipelines
of any traced Flax model cut automatically (``plan_pipeline``), the dynamic runtime, and
ZeRO-sharded training steps."""

from jax_exec.pipeline.dynamic import run_dynamic
from jax_exec.pipeline.dynamic_training import run_dynamic_training
from jax_exec.pipeline.mpmd import run_pipeline
from jax_exec.pipeline.pipeline_plan import PipelinePlan, PipelineStep
from jax_exec.pipeline.profile import profile as profile_stages
from jax_exec.pipeline.spmd import (
    nnx_blocks,
    sequential,
    shard_stacked,
    spmd_pipeline,
    spmd_value_and_grad,
    stack_blocks,
    stage_mesh,
    stage_orders,
)
from jax_exec.pipeline.traced import plan_pipeline
from jax_exec.zero import ZeroStep, zero_step

__all__ = [
    "PipelinePlan",
    "PipelineStep",
    "ZeroStep",
    "nnx_blocks",
    "plan_pipeline",
    "profile_stages",
    "run_dynamic",
    "run_dynamic_training",
    "run_pipeline",
    "sequential",
    "shard_stacked",
    "spmd_pipeline",
    "spmd_value_and_grad",
    "stack_blocks",
    "stage_mesh",
    "stage_orders",
    "zero_step",
]
