"""JSON load/save for every problem kind and for schedules, dispatched on ``format``
through the kind registry (:func:`schedir.kind.format_class`).

Loading is the boundary where untrusted files come in: whatever a file holds,
:func:`load` and :func:`from_dict` return an object or raise :class:`InvalidProblem`
/ :class:`InvalidSchedule` (both ``ValueError``) naming what is wrong; never another
exception type for a malformed file.
"""

from __future__ import annotations

import json
from pathlib import Path

from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.kind import format_class, format_tags

# Structural errors a class's from_dict raises on a wrong shape (a list where an object
# belongs, a missing key, an index out of range): malformed input, reported as such.
_SHAPE_ERRORS = (TypeError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError)


def from_dict(d: dict):
    """Rebuild a problem or schedule from its dict form.

    Raises :class:`InvalidProblem` (or :class:`InvalidSchedule` for a schedule) for any
    malformed input, with the ``format`` tag and what is wrong.
    """
    tag = d.get("format") if isinstance(d, dict) else None
    cls = format_class(tag) if isinstance(tag, str) else None
    if cls is None:
        shown = tag if isinstance(tag, str | None) else type(tag).__name__
        if not isinstance(d, dict):
            shown = f"a {type(d).__name__}, not an object with a format tag"
        raise InvalidProblem(f"format = {shown!r}: expected one of {', '.join(format_tags())}")
    try:
        return cls.from_dict(d)
    except (InvalidProblem, InvalidSchedule):
        raise
    except _SHAPE_ERRORS as err:
        error = InvalidSchedule if "schedule" in d["format"] else InvalidProblem
        detail = str(err) if not isinstance(err, RecursionError) else "nested too deeply"
        raise error(f"{d['format']}: malformed ({type(err).__name__}: {detail})") from None
    except ValueError as err:  # e.g. int('x'): already names the value
        error = InvalidSchedule if "schedule" in d["format"] else InvalidProblem
        raise error(f"{d['format']}: {err}") from None


def _no_constant(name: str):
    raise InvalidProblem(f"{name} is not a number in a schedir file (JSON has no NaN or infinity)")


def loads(text: str, source: str = "<string>"):
    """:func:`from_dict` of a JSON text; ``source`` names it in errors."""
    try:
        d = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise InvalidProblem(f"{source}: not valid JSON ({err})") from None
    except RecursionError:
        raise InvalidProblem(f"{source}: JSON nested too deeply") from None
    except ValueError as err:  # e.g. an integer beyond Python's digit limit
        raise InvalidProblem(f"{source}: {err}") from None
    return from_dict(d)


def load(path: str | Path):
    """Load a chain, graph, platform or schedule from a JSON file.

    >>> c = load("examples/chain_small.json"); c.length
    6
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InvalidProblem(f"{path}: not a UTF-8 text file ({err.reason})") from None
    return loads(text, str(path))


def save(obj, path: str | Path) -> None:
    """Write any object with ``to_dict()`` as indented JSON."""
    Path(path).write_text(json.dumps(obj.to_dict(), indent=1) + "\n")
