"""JSON load/save for every problem kind and for schedules, dispatched on ``format``."""

from __future__ import annotations

import json
from pathlib import Path

from schedir.chain import Chain
from schedir.errors import InvalidProblem
from schedir.platform import Platform
from schedir.schedule import Schedule

# JSON "format" tag -> class with from_dict. Other problem kinds register here.
FORMATS: dict[str, type] = {
    "schedir.chain": Chain,
    "schedir.platform": Platform,
    "schedir.schedule": Schedule,
}


def from_dict(d: dict):
    """Rebuild a problem or schedule from its dict form."""
    if not isinstance(d, dict) or d.get("format") not in FORMATS:
        tag = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise InvalidProblem(f"format = {tag!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[d["format"]].from_dict(d)


def load(path: str | Path):
    """Load a chain, graph, platform or schedule from a JSON file.

    >>> c = load("examples/chain_small.json"); c.length
    6
    """
    text = Path(path).read_text()
    try:
        d = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidProblem(f"{path}: not valid JSON ({err})") from None
    return from_dict(d)


def save(obj, path: str | Path) -> None:
    """Write any object with ``to_dict()`` as indented JSON."""
    Path(path).write_text(json.dumps(obj.to_dict(), indent=1) + "\n")
