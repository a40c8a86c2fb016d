"""Executing graph schedules: DAG models as named nodes, their profiler and runtime."""
