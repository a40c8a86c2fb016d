"""Bytes to integer memory slots (docs/semantics.md, discretization).

Every size is rounded *up* and the budget *down*, so a schedule that fits the slot
budget fits the byte budget. The opposite rounding (sizes down, budget up) is a
relaxation whose optimum bounds the byte optimum from below; solvers use both to
report the discretization loss.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from schedir.chain.problem import SIZE_FIELDS, Chain
from schedir.errors import InvalidProblem


@dataclass(frozen=True)
class Discretized:
    """A chain in slots.

    Attributes:
        chain: the chain with every size in slots.
        slot_size: bytes per slot.
        budget: the budget in slots.
    """

    chain: Chain
    slot_size: int
    budget: int


def size_unit(chain: Chain) -> int:
    """The greatest common divisor of every size of ``chain`` (1 if all are zero).

    Every memory need is a sum of sizes, so ``discretize(chain, budget,
    slot_size=size_unit(chain))`` is exact: sizes divide without rounding and a need
    fits the budget in bytes exactly when it fits the budget in units (rounded down).

    >>> size_unit(Chain.from_rotor([1.0], [1.0, 1.0], [4_000_000, 2_000_000],
    ...                            [0, 6_000_000], [0], [0, 1_000_000]))
    1000000
    """
    unit = math.gcd(*(v for f in SIZE_FIELDS for v in getattr(chain, f)))
    return unit or 1


def discretize(
    chain: Chain,
    budget: int,
    slots: int = 500,
    *,
    round_up: bool = True,
    slot_size: int | None = None,
) -> Discretized:
    """Map ``chain`` and a byte ``budget`` to about ``slots`` integer memory slots.

    ``slot_size = ceil(budget / slots)`` unless ``slot_size`` is given. With
    ``round_up`` (the default) sizes round up and the budget down: feasible in slots
    implies feasible in bytes. With ``round_up=False`` sizes round down and the budget
    up: a relaxation, for lower bounds. With ``slot_size=size_unit(chain)`` both are
    exact.

    >>> c = Chain.from_rotor([1.0], [1.0, 1.0], [1000, 999], [0, 1999], [0], [0, 10])
    >>> d = discretize(c, budget=5000, slots=50)
    >>> d.slot_size, d.budget, d.chain.in_size, d.chain.saved_size
    (100, 50, (10, 10), (20, 0))
    """
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 0:
        raise InvalidProblem(f"budget = {budget!r}: expected a non-negative integer of bytes")
    if budget == 0 and slot_size is None:
        raise InvalidProblem("budget = 0: give slot_size (slots of a zero budget are empty)")
    if isinstance(slots, bool) or not isinstance(slots, numbers.Integral) or slots <= 0:
        raise InvalidProblem(f"slots = {slots!r}: expected a positive integer")
    budget, slots = int(budget), int(slots)
    if slot_size is None:
        slot_size = -(-budget // slots)
    elif isinstance(slot_size, bool) or not isinstance(slot_size, numbers.Integral):
        raise InvalidProblem(f"slot_size = {slot_size!r}: expected a positive integer")
    elif slot_size <= 0:
        raise InvalidProblem(f"slot_size = {slot_size!r}: expected a positive integer")
    slot_size = int(slot_size)
    if round_up:
        fields = {f: tuple(-(-v // slot_size) for v in getattr(chain, f)) for f in SIZE_FIELDS}
        slot_budget = budget // slot_size
    else:
        fields = {f: tuple(v // slot_size for v in getattr(chain, f)) for f in SIZE_FIELDS}
        slot_budget = -(-budget // slot_size)
    return Discretized(replace(chain, **fields), slot_size, slot_budget)
