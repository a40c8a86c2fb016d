"""Planning with Python's cyclic garbage collector paused (docs/auto.md, "Planning exactly").

Planning traces hundreds of small JAX functions and keeps what it traced (jaxprs,
lowered kernels): some hundred thousand long-lived objects, which every full collection
walks again. Measured on the zoo's t5 at its least budget (gc callbacks): 4 full and
~900 young collections took 0.76 s of the main thread and found ~3,700 unreachable
objects (a few MiB). So the collector is paused while a plan is made and resumed after
(a collection it owes runs then, as it would have); reference counting frees everything
else meanwhile. The pause is process-wide: another thread's cyclic garbage waits too.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

F = TypeVar("F", bound=Callable)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector inside (nested pauses: the outermost resumes it;
    one the caller paused stays paused)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def without_gc(fn: F) -> F:
    """``fn`` run with the cyclic collector paused (:func:`gc_paused`)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
