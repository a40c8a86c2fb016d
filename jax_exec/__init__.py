"""jax_exec: everything that touches JAX and Flax (docs/jax_exec.md).

- :func:`plan` / :func:`value_and_grad`: any Flax NNX model, from its code alone: the
  automatic planner (:mod:`jax_exec.auto`, docs/auto.md); ``plan(..., scope="device",
  optimizer=..., data_parallel=N)`` (:func:`plan_device`) budgets the whole device:
  parameters, gradients and optimizer state placed as ZeRO stages or on the host
  together with the activations (:mod:`jax_exec.device_plan`, :func:`zero_step`,
  docs/device_memory.md).
- :func:`run`: execute one step of any schedule (chain, offload, graph, pipeline) op by
  op, with measured memory; one :class:`RunResult` (:mod:`jax_exec.executor`).
- For models split by hand into a stage list (one array in, one out):
  :func:`profile` (-> ``schedir.Chain``), :func:`plan_stages` (profile and solve),
  :func:`stages_value_and_grad` / :func:`lower` (the compiled path, nested
  ``jax.checkpoint``), :func:`saved_activations` / :func:`expected_activations` (check
  it by the residuals JAX saves), :func:`split_layers` / :func:`as_stages` (what a
  stage list is: docs/jax_exec.md, "What the stage list accepts").
- :func:`profile_graph` / :func:`run_graph`: DAG models (dict of named nodes) as
  ``schedir.Graph``.
- :func:`run_dynamic` / :func:`run_dynamic_training`: several devices, tasks placed at
  run time by a policy (docs/pipelines.md, docs/dynamic_training.md).
"""

from jax_exec.chain.lowering import (
    Lowered,
    Residual,
    expected_activations,
    lower,
    saved_activations,
)
from jax_exec.chain.planning import plan_stages
from jax_exec.chain.profile import profile
from jax_exec.chain.runtime import run_chain
from jax_exec.execute.result import RunResult
from jax_exec.execute.tree import parse_tree
from jax_exec.graph.model import sequential_dag
from jax_exec.graph.profile import profile_graph
from jax_exec.graph.runtime import GraphRunResult, run_graph
from jax_exec.offload.lowering import (
    lower_offload,
    offload_residuals,
    offload_value_and_grad,
)
from jax_exec.offload.runtime import OffloadRunResult, measure_platform, run_offload
from jax_exec.stages.split import Stage, StageList, as_stages, split_layers

__all__ = [
    "GraphRunResult",
    "Lowered",
    "OffloadRunResult",
    "measure_platform",
    "run_offload",
    "lower_offload",
    "offload_residuals",
    "offload_value_and_grad",
    "Residual",
    "RunResult",
    "Stage",
    "StageList",
    "as_stages",
    "expected_activations",
    "lower",
    "parse_tree",
    "plan_stages",
    "profile",
    "profile_graph",
    "run_graph",
    "saved_activations",
    "sequential_dag",
    "split_layers",
    "stages_value_and_grad",
]

# Several devices (docs/pipelines.md).
from jax_exec.pipeline.dynamic import DynamicRunResult, run_dynamic  # noqa: E402
from jax_exec.pipeline.dynamic_training import run_dynamic_training  # noqa: E402
from jax_exec.pipeline.mpmd import PipelineRunResult, run_pipeline  # noqa: E402
from jax_exec.pipeline.spmd import (  # noqa: E402
    nnx_blocks,
    sequential,
    shard_stacked,
    spmd_pipeline,
    spmd_value_and_grad,
    stack_blocks,
    stage_mesh,
    stage_orders,
)

__all__ += [
    "DynamicRunResult",
    "PipelineRunResult",
    "nnx_blocks",
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
]
# The executor protocol: one ``run`` for every schedule class (docs/jax_exec.md).
from jax_exec.executor import (  # noqa: E402
    Executor,
    executor_for,
    register,
    run,
    stages_value_and_grad,
    unregister,
)

__all__ += ["Executor", "executor_for", "register", "run", "run_chain", "unregister"]
# Any Flax NNX model, automatically (docs/auto.md): ``plan`` and ``value_and_grad``;
# ``plan(..., scope="device")`` budgets the whole device (docs/device_memory.md).
from jax_exec import auto  # noqa: E402, F401
from jax_exec.device_plan import (  # noqa: E402
    DevicePlan,
    DeviceRun,
    plan,
    plan_device,
    value_and_grad,
)
from jax_exec.zero import ZeroStep, zero_step  # noqa: E402

__all__ += ["DevicePlan", "DeviceRun", "ZeroStep", "plan", "plan_device", "value_and_grad",
            "zero_step"]  # fmt: skip
