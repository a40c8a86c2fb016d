"""Solvers of ``schedir.PipelineProblem`` and ``MasterWorker`` (docs/pipelines.md);
importing registers them."""

from solvers.pipeline import (
    dp,
    dynamic,
    greedy,
    joint,
    joint_milp,
    master_worker_lp,
    milp,
    one_f_one_b,
    stage_plans,
)

__all__ = [
    "dp",
    "dynamic",
    "greedy",
    "joint",
    "joint_milp",
    "master_worker_lp",
    "milp",
    "one_f_one_b",
    "stage_plans",
]
