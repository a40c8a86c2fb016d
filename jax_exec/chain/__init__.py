"""Executing chain schedules: the op-by-op runtime, the compiled lowering (nested
``jax.checkpoint``), the chain profiler and the stage-list planner."""
