"""Which solver a method name means, and the chain and graph methods, solved on fixed
options of a block model (docs/auto.md, "Chain and graph methods")."""

from __future__ import annotations

import inspect

import solvers
from jax_exec.auto.reference import reference_schedule
from jax_exec.program.model import BlockModel
from schedir import Chain, Graph, simulate
from schedir.blocks.graph import block_graph
from schedir.blocks.problem import BlockChain
from schedir.blocks.schedule import BlockSchedule
from solvers.blocks.policies import POLICIES

BLOCK_METHODS = ("auto", "block_rotor", "whole_milp", *POLICIES)
CHAIN_METHODS = tuple(m.name for m in solvers.available(Chain))
GRAPH_METHODS = tuple(m.name for m in solvers.available(Graph))


def solver_of(method: str) -> tuple[str, str]:
    """``(family, registered name)`` of ``method``: family ``"blocks"``, ``"chain"`` or
    ``"graph"`` (names both kinds have are chain methods unless ``"graph:<name>"``)."""
    if isinstance(method, str) and method.startswith("graph:") and method[6:] in GRAPH_METHODS:
        return "graph", method[6:]
    if method in BLOCK_METHODS:
        return "blocks", "block_rotor" if method == "auto" else method
    if method in CHAIN_METHODS:
        return "chain", method
    if method in GRAPH_METHODS:
        return "graph", method
    names = (*BLOCK_METHODS, *CHAIN_METHODS, *(m for m in GRAPH_METHODS if m not in CHAIN_METHODS),
             *(f"graph:{m}" for m in GRAPH_METHODS if m in CHAIN_METHODS))  # fmt: skip
    raise ValueError(f"method = {method!r}: expected one of {', '.join(names)}")


# nnx.value_and_grad's own options, which a drop-in user may pass on (argnums: plan's
# is wrt, value_and_grad's its own keyword)
NOT_SUPPORTED = frozenset({"argnums", "holomorphic", "allow_int"})


def check_plan_options(solver: tuple[str, str], options: dict) -> None:
    """A one-line ``TypeError`` naming an option of ``plan`` that the method
    (``solver``: :func:`solver_of`'s) does not take, whatever the budget (the solver may
    not run where store-all fits). Chain and graph methods also take ``graph_option``."""
    unsupported = sorted(NOT_SUPPORTED.intersection(options))
    if unsupported:
        key = unsupported[0]
        if key == "argnums":
            raise TypeError(
                f"argnums = {options[key]!r}: plan differentiates the model's parameters; "
                f"give wrt= a filter of them (nnx.LoRAParam) for nnx.DiffState(0, filter)"
            )
        raise TypeError(
            f"{key} = {options[key]!r}: an option of nnx.value_and_grad that jax_exec does "
            f"not take: it differentiates the model's real nnx.Param variables"
        )
    family, name = solver
    rest = dict(options)
    if family != "blocks":
        rest.pop("graph_option", None)
    if name == "whole_milp":
        from jax_exec.auto.whole import whole_plan

        inner = ("bm", "budget", "reference", "exact", "to_beat")  # plan sets these
        taken = tuple(p for p in inspect.signature(whole_plan).parameters if p not in inner)
        for key, value in rest.items():
            if key not in taken:
                raise TypeError(f"{key} = {value!r}: method 'whole_milp' takes no such option; "
                                f"its options: {', '.join(taken)}{ARGUMENTS_HINT}")  # fmt: skip
        return
    problem = {"blocks": BlockChain, "chain": Chain, "graph": Graph}[family]
    try:
        solvers.check_options(name, problem, rest)
    except TypeError as err:
        raise TypeError(f"{err}{ARGUMENTS_HINT}") from None


# keyword arguments of plan and value_and_grad(...) are the planner's: the loss's own
# are easily given there by mistake
ARGUMENTS_HINT = (
    " (loss_fn's own keyword arguments: give them to the step, value_and_grad(...)(model, "
    "x, key=...), or bind them for plan with functools.partial)"
)


def whole_limit(method: str, whole_graph: int) -> int:
    """The ``whole_graph`` limit ``method`` plans with: ``"auto"``'s, 0 for the rest."""
    if isinstance(whole_graph, bool) or not isinstance(whole_graph, int) or whole_graph < 0:
        raise ValueError(f"whole_graph = {whole_graph!r}: expected an int >= 0 (variables)")
    return whole_graph if method == "auto" else 0


def fixed_options(bm: BlockModel, name: str = "store_all") -> tuple[int, ...]:
    """One option per block: the store-all reference's, or the option called ``name``."""
    if name == "store_all":
        return reference_schedule(bm).options
    found = []
    for k, stage in enumerate(bm.problem.stages):
        names = [o.name for o in stage.options]
        if name not in names:
            raise ValueError(f"graph_option = {name!r}: block {k} has options {names}")
        found.append(names.index(name))
    return tuple(found)


def solve_fixed(bm: BlockModel, nbytes: int, family: str, name: str, options: dict):
    """A chain or graph method on fixed options (the store-all reference's, or
    ``options["graph_option"]``): on ``to_chain`` (an upper bound of the block chain,
    which prices the schedule) or on the block graph (exact)."""
    options = dict(options)
    chosen = fixed_options(bm, options.pop("graph_option", "store_all"))
    if family == "graph":
        graph, _ = block_graph(bm.problem, chosen)
        schedule = solvers.solve(graph, nbytes, method=name, **options)
        return schedule
    chain_schedule = solvers.solve(bm.problem.to_chain(chosen), nbytes, method=name, **options)
    meta = {**chain_schedule.meta, "solved_on": "to_chain"}
    meta["chain_peak_memory"] = meta.pop("peak_memory")
    schedule = BlockSchedule(chain_schedule.ops, meta, chosen)
    trace = simulate(bm.problem, schedule)
    schedule.meta.update(peak_memory=trace.peak_memory, makespan=trace.makespan)
    return schedule
