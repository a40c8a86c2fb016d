"""The one place jax_exec calls a private JAX function.

JAX reports what a differentiated function saves for its backward only through
``jax.ad_checkpoint.print_saved_residuals``, which prints. The function behind it,
``jax._src.ad_checkpoint.saved_residuals``, returns the same facts as data; JAX 0.10
has no public equivalent. The compiled path's checks (``jax_exec.saved_activations``,
``jax_exec.auto``'s plan checks) need them as data, so they call :func:`saved_residuals`
here and nowhere else. tests/jax_exec/test_jax_residuals.py fails if JAX moves the function or
changes what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def saved_residuals(fn: Callable, *args: Any) -> list[tuple[Any, str]]:
    """``(aval, source)`` of every array JAX saves at the top level of ``jax.vjp(fn, *args)``.

    ``aval`` has ``shape`` and ``dtype``; ``source`` is JAX's description, e.g.
    ``"from the argument x"``, ``"from a literal"`` or the primitive that made it.
    """
    from jax._src.ad_checkpoint import saved_residuals as private  # no public equivalent

    return list(private(fn, *args))
