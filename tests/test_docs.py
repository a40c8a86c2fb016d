"""Every code block of ``README.md`` and ``docs/*.md`` runs.

- ```` ```python ```` blocks: the blocks of one file run in order in one fresh
  namespace, with the repository root as working directory (a page is one script).
- ```` ```json ```` blocks: each is a whole schedir file and loads with
  ``schedir.from_dict`` (a fragment belongs in a ```` ```text ```` block).
- ```` ```bash ```` blocks: each line that is a ``schedir`` command (``schedir ...`` or
  ``.venv/bin/schedir ...``) runs through ``schedir_cli.main`` and must exit 0; other
  lines (``make demo``, ``python ...``) are not run here, and neither is a command
  whose line ends with ``# slow`` (profiling, the full experiment run). Outputs go
  under ``results/``, which git ignores.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(page: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == language]


def schedir_commands(page: Path) -> list[list[str]]:
    commands = []
    for body in blocks(page, "bash"):
        for line in body.splitlines():
            line = line.strip()
            if line.endswith("# slow"):
                continue
            words = shlex.split(line, comments=True)
            if words and words[0] in ("schedir", ".venv/bin/schedir"):
                commands.append(words[1:])
    return commands


JSON_BLOCKS = [
    pytest.param(page, i, body, id=f"{page.name}[json {i}]")
    for page in PAGES
    for i, body in enumerate(blocks(page, "json"))
]


@pytest.mark.parametrize("page, index, body", JSON_BLOCKS)
def test_json_block_loads(page: Path, index: int, body: str) -> None:
    """Every JSON example is a file schedir reads (its format tag, valid fields)."""
    import json

    import schedir

    try:
        obj = schedir.from_dict(json.loads(body))
    except Exception as err:
        raise AssertionError(f"{page.name}, json block {index} does not load: {err}") from err
    assert schedir.from_dict(obj.to_dict()) == obj


def test_json_blocks_are_collected() -> None:
    assert len([p for p in JSON_BLOCKS if p.values[0].name == "formats.md"]) >= 4


RUNNABLE = [pytest.param(p, id=p.name) for p in PAGES if blocks(p, "python") or schedir_commands(p)]


@pytest.mark.parametrize("page", RUNNABLE)
def test_page(page: Path, monkeypatch, capsys) -> None:
    """The page's python blocks in order, then its schedir commands (which may use files
    the python blocks wrote)."""
    from schedir_cli.app import main

    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(blocks(page, "python")):
        try:
            # dont_inherit: the page runs as a script, without this file's __future__
            # imports (string annotations would break a page's dataclasses)
            exec(compile(code, f"{page.name}[block {i}]", "exec", dont_inherit=True), namespace)
        except Exception as err:
            raise AssertionError(f"{page.name}, python block {i} failed: {err!r}") from err
    for argv in schedir_commands(page):
        status = main(argv)
        err = capsys.readouterr().err
        assert status == 0, f"{page.name}: schedir {shlex.join(argv)} -> {status}: {err}"


def test_every_page_is_collected() -> None:
    assert {"README.md", "concepts.md", "tutorial.md", "formats.md", "extending.md", "cli.md"} <= {
        p.name for p in PAGES
    }
