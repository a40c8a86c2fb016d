"""Solvers of ``schedir.PipelineProblem`` and ``MasterWorker`` (docs/pipelines.md);
importing registers them."""

from solvers.pipeline import (
    dp,
    dynamic,
    greedy,
    guided,
    inflight,
    joint,
    joint_milp,
    master_worker_lp,
    milp,
    one_f_one_b,
    policies,
    stage_plans,
    training_lp,
)

__all__ = [
    "dp",
    "dynamic",
    "greedy",
    "guided",
    "inflight",
    "joint",
    "joint_milp",
    "master_worker_lp",
    "milp",
    "one_f_one_b",
    "policies",
    "stage_plans",
    "training_lp",
]
