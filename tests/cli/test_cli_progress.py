"""Long solves show progress on stderr from the command line (issue 11), quiet with -q:
lines, or rich's bar on a terminal."""

from __future__ import annotations

import functools
import io
import re
import sys
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


class Terminal(io.StringIO):
    """A stderr that says it is a terminal (rich then draws its bar)."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_cleared_at_the_end(monkeypatch) -> None:
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    report = solvers.registry._StderrProgress("rotor", delay=0.0, every=0.0)
    report(0.25, "DP table")
    report.idle(0.0)
    report.done()
    text = err.getvalue()
    assert "rotor: DP table" in text and "rotor: running" in text  # the bar, redrawn
    last = text.splitlines()[-1]  # the bar cleared (ANSI codes), then one line
    assert "\x1b[" in text and re.fullmatch(r"(\r|\x1b\[\w+)*rotor: done in \d+\.\d s", last)
    assert "DP table" not in text.split("rotor: DP table")[0]  # named from its first frame


def test_experiments_show_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch, capsys) -> None:
    from schedir_cli.report import _Bar

    bar = _Bar(2)  # stderr captured: not a terminal, one line per experiment
    bar.running("a")
    bar.finished("a", 1.2, "ok")
    bar.close()
    assert capsys.readouterr().err == "1/2 a 1s ok\n"
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    bar = _Bar(2)
    bar.running("a")
    bar.finished("a", 1.2, "ok")
    bar.running("b")
    bar.finished("b", 0.1, "FAILED (3)")
    bar.close()
    text = err.getvalue()
    assert "1/2 a 1s ok" in text and "2/2 b 0s FAILED (3)" in text and "\x1b[" in text
