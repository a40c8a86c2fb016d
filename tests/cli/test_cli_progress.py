"""Long solves show progress on stderr from the command line (issue 11), quiet with -q."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import solvers.registry
from schedir_cli import main

ROOT = Path(__file__).resolve().parents[2]
CHAIN = str(ROOT / "examples" / "chain_small.json")


@pytest.fixture
def impatient(monkeypatch):
    """Progress lines from the first report on, as a solve longer than 2 s would print."""
    eager = functools.partial(solvers.registry._StderrProgress, delay=0.0, every=0.0)
    monkeypatch.setattr(solvers.registry, "_StderrProgress", eager)


COMMANDS = [["solve", CHAIN, "-b", "1400"], ["tradeoff", CHAIN, "-m", "rotor", "--points", "3"]]


@pytest.mark.parametrize("command", COMMANDS)
def test_long_solves_print_progress_unless_quiet(impatient, capsys, command) -> None:
    assert main(command) == 0
    out, err = capsys.readouterr()
    prefix = f"{command[0] if command[0] == 'tradeoff' else 'rotor'}:"
    assert err.startswith(prefix) and "% DP table" in err and "% DP table" not in out
    assert main([*command, "-q"]) == 0
    assert "%" not in capsys.readouterr().err
