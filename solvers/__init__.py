"""solvers: every algorithm that turns a problem into a ``schedir.Schedule``.

Solvers are found by name through one registry::

    import solvers
    schedule = solvers.solve(chain, budget, method="rotor")
    [m.name for m in solvers.available(chain)]

Imports schedir, numpy and cvxpy; never jax.
"""

# Importing a solver module registers it.
from solvers import store_all as _store_all  # noqa: F401
from solvers.registry import Infeasible, Method, available, get, register, solve

__all__ = ["Infeasible", "Method", "available", "get", "register", "solve"]
