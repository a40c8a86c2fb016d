"""Memory budgets as users write them: the one parser of the library (the command line,
the solvers' registry, the automatic planner and the whole-device planner read it).

A budget is a whole number of bytes. It may be given as

- an ``int`` (any size; also a ``Fraction`` or float that is a whole number, a float at
  most 2**53, where floats stop being exact integers);
- a string: ``"1400"``, ``"12GiB"``, ``"1.5 GB"``, ``"512 MiB"`` (binary units KiB,
  MiB, GiB, TiB; decimal kB, MB, GB, TB; B), or ``"50%"`` of a reference that the
  caller states (the store-all peak for activations, the plain step's whole-device
  bytes for the device planner).

Arithmetic is exact (rational): ``"100%"`` is the reference to the byte, and a unit or
a percentage rounds down (a smaller budget is always safe). A bad budget raises
:class:`BudgetError`, one line naming the field and the value.

>>> parse_budget("2KiB"), parse_budget("1.5 kB"), parse_budget("50%", 1630), parse_budget(7.0)
(2048, 1500, 815, 7)
>>> format_bytes(3 * 2**30 // 2)
'1.5 GiB'
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from fractions import Fraction

from schedir.errors import InvalidProblem

UNITS = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
KNOWN_UNITS = "B, KiB, MiB, GiB, TiB, kB, MB, GB, TB or %"
_NUMBER = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_TEXT = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z%]*)\s*$")
_EXACT_FLOAT = 2**53  # floats are exact integers only up to here


class BudgetError(InvalidProblem):
    """A budget that is not a whole, non-negative number of bytes (or a reference is
    missing for a percentage); the message names the field and the value."""


def _shown(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


Reference = int | Callable[[], int] | None


def parse_budget(budget: object, reference: Reference = None, *, field: str = "budget") -> int:
    """Bytes from ``budget`` (module docstring). ``reference``: the bytes of 100% (an int,
    or a function computing it, called only for a percentage)."""
    if isinstance(budget, str):
        return _parse_text(budget, reference, field)
    if budget is None:
        raise BudgetError(f"{field} = None: expected bytes (an int), '12GiB' or '50%'")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise BudgetError(f"{field} = {_shown(budget)}: expected bytes (an int), '12GiB' or '50%'")
    if isinstance(budget, numbers.Integral):
        value = int(budget)
    elif isinstance(budget, Fraction):
        if budget.denominator != 1:
            raise BudgetError(f"{field} = {budget!r}: expected a whole number of bytes")
        value = int(budget)
    else:
        number = float(budget)
        if not math.isfinite(number) or not number.is_integer():
            raise BudgetError(f"{field} = {budget!r}: expected a whole number of bytes")
        if abs(number) > _EXACT_FLOAT:
            raise BudgetError(
                f"{field} = {budget!r}: a float above 2**53 is not an exact number of bytes; "
                "give an int"
            )
        value = int(number)
    if value < 0:
        raise BudgetError(f"{field} = {budget!r}: expected a non-negative number of bytes")
    return value


def is_percentage(budget: object) -> bool:
    """Whether ``budget`` is a percentage (``"50%"``): its bytes need the reference."""
    match = _TEXT.match(budget) if isinstance(budget, str) else None
    return match is not None and match.group(2) == "%"


def _parse_text(text: str, reference: Reference, field: str) -> int:
    shown = _shown(text)
    match = _TEXT.match(text)
    if match is None:
        raise BudgetError(
            f"{field} = {shown}: expected a number with a unit (12GiB, 512MiB, 1400) or a "
            f"percentage (50%)"
        )
    number, unit = match.group(1), match.group(2)
    if not number.isdigit():  # digits are an exact integer of any size; 1e400 is not finite
        if not math.isfinite(float(number)):
            raise BudgetError(f"{field} = {shown}: not a finite number")
        exponent = re.split("[eE]", number)[1:]
        if exponent and abs(int(exponent[0])) > 400:  # 1e-500: slow to expand, no byte count
            raise BudgetError(f"{field} = {shown}: exponent out of range")
    try:
        value = Fraction(number)
    except ValueError as err:  # more digits than Python converts
        raise BudgetError(f"{field} = {shown}: {err}") from None
    if unit == "%":
        if reference is None:
            raise BudgetError(f"{field} = {shown}: a percentage needs a reference (100%)")
        whole = reference() if callable(reference) else reference
        return math.floor(value * whole / 100)
    if unit.lower() not in UNITS and unit != "":
        raise BudgetError(f"{field} = {shown}: unknown unit {unit!r} (known: {KNOWN_UNITS})")
    scale = UNITS.get(unit.lower(), 1)
    if scale == 1 and value.denominator != 1:
        raise BudgetError(f"{field} = {shown}: not a whole number of bytes")
    return math.floor(value * scale)


def format_bytes(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit it reaches, 3 significant figures
    (``'1.5 GiB'``, ``'812 B'``)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def in_units_of(nbytes: int, given: object, reference: int | None = None) -> str:
    """``nbytes`` as the user wrote their budget: bytes, and where ``given`` (their
    budget) had a unit or a percentage also in that unit or as a percentage of
    ``reference``, e.g. ``'3,221,225,472 B (3 GiB)'``, ``'1,630 B (47.5%)'``."""
    text = f"{nbytes:,} B"
    if isinstance(given, str) and (match := _TEXT.match(given)):
        unit = match.group(2)
        if unit == "%" and reference:
            return f"{text} ({100 * nbytes / reference:.3g}% of {reference:,} B)"
        if unit.lower() in UNITS and UNITS[unit.lower()] > 1:
            scale = UNITS[unit.lower()]
            return f"{text} ({nbytes / scale:.4g} {unit})"
    if reference:
        return f"{text} ({100 * nbytes / reference:.3g}% of {reference:,} B)"
    return text
