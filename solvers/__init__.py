"""solvers: every algorithm that turns a problem into a ``schedir.Schedule``.

Solvers are found by name through one registry::

    import solvers
    schedule = solvers.solve(chain, budget, method="rotor")
    [m.name for m in solvers.available(chain)]

Every public module of this package is one solver (or family) that registers itself
on import; they are all imported here, so adding a solver is adding a file.
Imports schedir, numpy and cvxpy; never jax.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from solvers._tradeoff import Tradeoff, tradeoff
from solvers.registry import (
    Infeasible,
    MemoryLimit,
    Method,
    available,
    get,
    register,
    solve,
)

for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name != "registry":
        _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Infeasible",
    "MemoryLimit",
    "Method",
    "Tradeoff",
    "available",
    "get",
    "register",
    "solve",
    "tradeoff",
]
