"""Solvers of ``schedir.PipelineProblem`` and ``MasterWorker`` (docs/pipelines.md);
importing registers them."""

from solvers.pipeline import dp, dynamic, greedy, master_worker_lp, milp, one_f_one_b

__all__ = ["dp", "dynamic", "greedy", "master_worker_lp", "milp", "one_f_one_b"]
