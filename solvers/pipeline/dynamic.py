"""Dynamic policies: ``eager``, ``dmda``, ``dmdas``, the static list scheduler ``heft``,
and (:mod:`solvers.pipeline.guided`) ``static`` and ``guided``.

Each is written once and run both by the simulator (:func:`run_policy`, i.e.
:func:`schedir.dynamic.simulate_dynamic`) and by the JAX runtime
(``jax_exec.pipeline.dynamic``): it reads the one
:class:`schedir.dynamic.RuntimeState`, which admits tasks under the devices'
memory and evicts as DTR does (docs/dynamic_training.md).

- ``eager``: one shared pool; an idle device starts the oldest ready task that fits
  (StarPU's ``eager``). No performance model.
- ``dmda`` (deque model, data aware; Augonnet et al., CCPE 2011): when a task becomes
  ready it goes to the device u minimizing its predicted end
  ``max(queue end of u, now + transfer time of its inputs to u) + predicted time on u
  + time to make room on u`` (:meth:`RuntimeState.memory_delay`: the offload time of
  the bytes short). Predictions come from a :class:`HistoryModel`: per (task kind,
  device), the mean of the measured durations so far, the profile's ``work / speed``
  before any. Each device runs its queue in order (the first that fits).
- ``dmdas``: dmda's placement; each device starts its ready tasks by decreasing
  priority, the upward rank (critical path to an exit, as HEFT's), as StarPU's dmdas
  sorts its queues by priority.
- ``heft`` (Topcuoglu, Hariri and Wu, IEEE TPDS 2002): tasks by decreasing upward rank
  (mean time + heaviest path of mean compute and communication to an exit), each to
  the device of earliest finish (no insertion); the per-device orders are then fixed
  and executed as such, whatever the actual times.
"""

from __future__ import annotations

from collections import defaultdict

from schedir.dynamic import DynamicTrace, TaskGraph, pipeline_graph, simulate_dynamic
from schedir.pipeline.ops import Fwd, Recv, Send
from schedir.pipeline.problem import PipelineProblem, capacity
from schedir.pipeline.schedule import PipelineSchedule
from schedir.pipeline.simulate import Noise, simulate_pipeline
from schedir.platform import Platform
from solvers.pipeline.guided import Guided, Static, plan_lists
from solvers.pipeline.policies import (
    Dmda,
    Dmdas,
    Eager,
    Heft,
    HistoryModel,
    list_schedule,
    upward_rank,
)
from solvers.registry import Infeasible, register

__all__ = ["POLICIES", "Dmda", "Dmdas", "Eager", "Guided", "Heft", "HistoryModel", "Static",
           "list_schedule", "make_policy", "run_policy", "upward_rank"]  # fmt: skip


POLICIES = ("eager", "dmda", "dmdas", "heft", "static", "guided")


def make_policy(
    name: str, graph: TaskGraph, platform: Platform, *, plan=None, memory=None, **options
):
    """A fresh policy object: ``eager``, ``dmda``, ``dmdas``, ``heft``, or with a static
    ``plan`` (device -> tasks, a :class:`~schedir.pipeline.ops.PipelineSchedule` of the
    graph's groups, ``"heft"`` or None: HEFT's lists) ``static`` and ``guided``, which
    also takes a list of plans (it follows the one ending first at the profile's
    times); ``options`` go to the guided policy (``tol``, ``z``, ``min_samples``), and so
    does ``memory`` (the capacities its plans are timed with)."""
    if name == "eager":
        return Eager(graph, platform)
    if name == "dmda":
        return Dmda(graph, platform)
    if name == "dmdas":
        return Dmdas(graph, platform)
    if name == "heft":
        return Heft(graph, platform)
    if name == "static":
        return Static(plan_lists(graph, platform, plan))
    if name == "guided":
        many = isinstance(plan, list | tuple)
        plans = [plan_lists(graph, platform, p) for p in (plan if many else [plan])]
        return Guided(graph, platform, plans, memory=memory, **options)
    raise ValueError(f"policy = {name!r}: expected one of {', '.join(POLICIES)}")


def run_policy(
    graph: TaskGraph,
    platform: Platform,
    policy: str,
    *,
    noise: Noise | None = None,
    window: int | None = None,
    memory: dict | None = None,
    prefetch: bool = True,
    plan=None,
    **options,
) -> DynamicTrace:
    """Run ``graph`` on ``platform`` under the named policy (:func:`make_policy`) in
    the simulator; ``memory`` overrides device capacities (bytes)."""
    pol = make_policy(policy, graph, platform, plan=plan, memory=memory, **options)
    return simulate_dynamic(graph, platform, pol, noise=noise, window=window, memory=memory,
                            prefetch=prefetch)  # fmt: skip


def realized_schedule(problem: PipelineProblem, graph: TaskGraph, trace: DynamicTrace, cuts):
    """The placement and order a run realized, as per-device op lists (inference)."""
    per_dev: dict = defaultdict(list)
    succ = graph.successors()
    index = {}
    for t, task in enumerate(graph.tasks):
        g = int(task.kind[1:])
        index[t] = (g, task.item)
    for t in sorted(range(len(graph.tasks)), key=lambda t: (trace.start[t], t)):
        g, n = index[t]
        dev = trace.device[t]
        for p, _ in graph.tasks[t].deps:
            if trace.device[p] != dev:
                per_dev[dev].append(Recv("a", cuts[g], n, trace.device[p]))
        per_dev[dev].append(Fwd(cuts[g], cuts[g + 1], n))
        for s in succ[t]:
            if trace.device[s] != dev:
                per_dev[dev].append(Send("a", cuts[g + 1], n, trace.device[s]))
    return tuple((u, tuple(ops)) for u, ops in per_dev.items())


def _check_memory(problem: PipelineProblem, schedule: PipelineSchedule, budget, policy) -> None:
    """Infeasible when the replayed run holds more than a device may (the policies place
    tasks by time only and do not plan memory)."""
    trace = simulate_pipeline(problem, schedule)
    for dev, peak in trace.device_peak.items():
        cap = capacity(problem, dev, budget)
        if cap is not None and peak > cap:
            raise Infeasible(policy, budget, None, f"the run holds {peak} bytes on {dev}, which "
                             f"may hold {cap}; {policy} does not plan memory")  # fmt: skip


def _registered(policy: str):
    def solve(
        problem: PipelineProblem,
        budget: int | None = None,
        *,
        items: int = 64,
        cuts: tuple[int, ...] | None = None,
        noise_sigma: float = 0.0,
        seed: int = 0,
        window: int | None = None,
    ) -> PipelineSchedule:
        if problem.training:
            raise NotImplementedError(
                f"{policy} through the registry is for inference; for training use "
                "solvers.pipeline.dynamic.run_policy(pipeline_graph(problem, ...), ...)"
            )
        cuts = tuple(cuts or range(problem.length + 1))
        graph = pipeline_graph(problem, items, cuts)
        # placed by time only, memory unlimited: the replayed schedule is judged below
        # by the pipeline simulator's own memory model
        unlimited = {d.name: None for d in problem.platform.devices}
        trace = run_policy(graph, problem.platform, policy, noise=Noise(noise_sigma, seed),
                           window=window, memory=unlimited)  # fmt: skip
        meta = {
            "method": policy,
            "kind": "inference",
            "items": items,
            "dynamic_period": trace.period,
            "dynamic_makespan": trace.makespan,
            "throughput": items / trace.makespan if trace.makespan > 0 else None,
            "exact": False,
        }
        schedule = PipelineSchedule(realized_schedule(problem, graph, trace, cuts), meta)
        _check_memory(problem, schedule, budget, policy)
        return schedule

    solve.__name__ = policy
    solve.__doc__ = f"Run the pipeline's task graph under {policy}; ops = realized placement."
    return solve


for _name, _desc in (
    ("eager", "dynamic: shared queue, idle devices pull (StarPU eager)"),
    ("dmda", "dynamic: earliest predicted end with transfers, history model (StarPU dmda)"),
    ("dmdas", "dynamic: dmda placement, queues by upward-rank priority (StarPU dmdas)"),
    ("heft", "static list scheduling by upward rank and earliest finish (HEFT)"),
):
    register(_name, problem=PipelineProblem, exact=False, description=_desc)(_registered(_name))
