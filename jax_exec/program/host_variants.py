"""Host-memory variants of a block model's save options (:attr:`SaveOption.host
<jax_exec.program.kernels.SaveOption.host>`, docs/auto.md): :func:`with_host_variants`
offers them, their copies over a platform's host link; :func:`host_variants_below` drops
those that keep too much in host memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax_exec.program.problem import build_problem
from schedir import Platform


def with_host_variants(model: Any, platform: Platform) -> Any:
    """A copy of ``model`` (a :class:`~jax_exec.program.model.BlockModel`) whose blocks
    also offer host-memory variants of their options (:attr:`SaveOption.host`), their
    copies over ``platform``'s host link (:func:`~jax_exec.program.problem.build_problem`):
    the late-residual variant of each option whose backward, cut into up to
    ``LATE_PHASES`` phases, has saved residuals its first phase does not read, and the
    all-on-host variant of each option that saves residuals its first
    phase reads (else it is the late one). So per saved value the block DP chooses
    among keeping it on the device, in host memory, or recomputing it (the options'
    save sets). Traces each variant's phased backward (and so its option's recording);
    compiles nothing: the variants run their options' recordings and backwards."""
    variants = _copy(model, host_link=platform)

    def offered(host: str) -> tuple:
        every = tuple(
            (*opts, *(dataclasses.replace(option, host=host) for option in base))
            for opts, base in zip(variants.options, model.options, strict=True)
        )
        variants.options = every
        return tuple(
            tuple(option for o, option in enumerate(opts)
                  if option.host != host or _worth(variants, k, o))
            for k, opts in enumerate(every)
        )  # fmt: skip

    variants.options = offered("late")
    variants.options = offered("all")
    variants.problem = build_problem(variants)
    return variants


def host_variants_below(model: Any, cap: int) -> Any:
    """``model`` (made by :func:`with_host_variants`) without the host-memory variants
    that keep ``cap`` bytes or more in host memory (``model`` itself when none does):
    the options on the device stay."""

    def kept(k: int, o: int) -> bool:
        return not model.option(k, o).host or sum(model.host_residuals(k, o).values()) < cap

    options = tuple(
        tuple(option for o, option in enumerate(opts) if kept(k, o))
        for k, opts in enumerate(model.options)
    )
    if options == model.options:
        return model
    fewer = _copy(model, options=options)
    fewer.problem = build_problem(fewer)
    return fewer


def _copy(model: Any, **changes: Any) -> Any:
    """A copy of ``model`` with ``changes``, its problem to build, nothing known to its
    own solves yet, its own timings (its tables of functions and kernels shared)."""
    return dataclasses.replace(model, problem=None, known=set(), timings=dict(model.timings),
                               **changes)  # fmt: skip


def _worth(model: Any, k: int, o: int) -> bool:
    """Whether block k's variant o keeps residuals in host memory, and others than its
    option's late-residual variant would."""
    held = model.host_residuals(k, o)
    if model.option(k, o).host == "late":
        return bool(held)
    return bool(held) and any(phase == 0 for phase in model.host_returns(k, o).values())
