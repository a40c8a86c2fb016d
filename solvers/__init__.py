"""solvers: every algorithm that turns a problem into a ``schedir.Schedule``.

Solvers are found by name through one registry::

    import solvers
    schedule = solvers.solve(chain, budget, method="rotor")
    [m.name for m in solvers.available(chain)]

Solvers are grouped by problem kind (``solvers.chain``, ``graph``, ``offload``,
``pipeline``, ``blocks``); each module is one solver (or family) that registers itself
on import, and each kind's package imports its modules, so adding a solver is adding a
file and one import. Imports schedir, numpy and cvxpy; never jax.
"""

from solvers import (
    blocks,
    chain,
    graph,
    offload,
    pipeline,
)  # importing a kind registers its solvers
from solvers._tradeoff import Tradeoff, tradeoff

# Each solver module by its name, as before the grouping by kind (solvers.rotor, ...).
from solvers.chain import chen_sqrt, recompute_all, revolve, rotor, store_all
from solvers.graph import checkmate_lp, checkmate_milp, dtr
from solvers.offload import offload_greedy, offload_milp, rotor_offload, weight_offload
from solvers.pipeline import dynamic, master_worker_lp
from solvers.registry import (
    Infeasible,
    MemoryLimit,
    Method,
    available,
    check_options,
    get,
    register,
    solve,
    unregister,
)

__all__ = [
    "Infeasible",
    "MemoryLimit",
    "Method",
    "Tradeoff",
    "available",
    "check_options",
    "get",
    "register",
    "solve",
    "tradeoff",
    "unregister",
    # the kind packages, and each solver module by its name as before the grouping
    "blocks",
    "chain",
    "graph",
    "offload",
    "pipeline",
    "checkmate_lp",
    "checkmate_milp",
    "chen_sqrt",
    "dtr",
    "dynamic",
    "master_worker_lp",
    "offload_greedy",
    "offload_milp",
    "recompute_all",
    "revolve",
    "rotor",
    "rotor_offload",
    "store_all",
    "weight_offload",
]
