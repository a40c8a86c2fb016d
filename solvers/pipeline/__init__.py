"""Solvers of ``schedir.PipelineProblem`` and ``MasterWorker`` (docs/pipelines.md);
importing registers them."""

from solvers.pipeline import (
    dp,
    dynamic,
    greedy,
    guided,
    master_worker_lp,
    milp,
    one_f_one_b,
    policies,
    training_lp,
)

__all__ = ["dp", "dynamic", "greedy", "guided", "master_worker_lp", "milp", "one_f_one_b",
           "policies", "training_lp"]  # fmt: skip
