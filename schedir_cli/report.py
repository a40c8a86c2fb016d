"""Run the experiment scripts and write ``REPORT.md`` (``schedir experiments``).

An experiment is any ``NAME.py`` in the experiments folder (``paper_experiments/``) not
starting with ``_``; it takes ``--quick`` and ``--out DIR`` and writes CSV and PNG files
into DIR. :func:`run_all` runs each in a subprocess (``python NAME.py [--quick] --out
OUT/NAME``, cwd = the folder's parent, i.e. the repository root), shows a progress bar
on stderr when it is a terminal (rich's; else one line per experiment), keeps each
script's output in ``OUT/NAME/log.txt`` and writes ``OUT/REPORT.md``, which embeds
every PNG and every CSV (as a markdown table, long ones truncated with a note) under
the exact command that produced them. The standard library and rich only (imported
when a terminal shows the bar).
"""

from __future__ import annotations

import csv
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MAX_ROWS = 25  # rows of a CSV shown in the report before truncating
MAX_COLS = 12


@dataclass(frozen=True)
class Outcome:
    """What running one experiment did."""

    name: str
    command: list[str]
    status: int  # exit status; -1 for a timeout
    seconds: float
    out: Path


def find_experiments(directory: Path, names: list[str] | None = None) -> list[str]:
    """Experiment names in ``directory`` (sorted), or ``names`` checked against them."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such experiments folder")
    found = sorted(p.stem for p in directory.glob("*.py") if not p.stem.startswith("_"))
    if not names:
        return found
    unknown = [n for n in names if n.removesuffix(".py") not in found]
    if unknown:
        raise ValueError(f"unknown experiment {unknown[0]!r}; known: {', '.join(found)}")
    return [n.removesuffix(".py") for n in names]


class _Bar:
    """The experiments' progress on stderr: rich's bar on a terminal (the running
    experiment's name and time, one line kept per finished experiment); elsewhere
    only those lines."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.bar = total, 0, None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            columns = (BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
            self.bar = Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True))
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def running(self, name: str) -> None:
        if self.bar is not None:
            self.bar.reset(self.task, total=self.total, completed=self.done, description=name)

    def finished(self, name: str, seconds: float, verdict: str) -> None:
        self.done += 1
        line = f"{self.done}/{self.total} {name} {seconds:.0f}s {verdict}"
        if self.bar is None:
            print(line, file=sys.stderr, flush=True)
            return
        self.bar.console.print(line, highlight=False)
        self.bar.update(self.task, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_one(
    name: str, directory: Path, out: Path, *, quick: bool, timeout: float | None, bar=None
) -> Outcome:
    """Run ``directory/name.py`` into ``out/name``; its output goes to ``out/name/log.txt``
    (``bar``: a :class:`_Bar` told when it starts and ends)."""
    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    cwd = directory.resolve().parent
    script = directory.resolve() / f"{name}.py"
    rel_script = script.relative_to(cwd) if script.is_relative_to(cwd) else script
    full = target.resolve()
    out_arg = full.relative_to(cwd) if full.is_relative_to(cwd) else full
    command = ["python", str(rel_script), *(["--quick"] if quick else []), "--out", str(out_arg)]
    start = time.perf_counter()
    if bar is not None:
        bar.running(name)
    with open(target / "log.txt", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, *command[1:]], cwd=cwd, stdout=log, stderr=subprocess.STDOUT
        )
        status = None
        while status is None:
            try:
                status = proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                elapsed = time.perf_counter() - start
                if timeout is not None and elapsed > timeout:
                    proc.kill()
                    proc.wait()
                    status = -1
                    log.write(f"\nkilled after {timeout:.0f} s (--timeout)\n")
    seconds = time.perf_counter() - start
    verdict = "ok" if status == 0 else ("timeout" if status == -1 else f"FAILED ({status})")
    if bar is not None:
        bar.finished(name, seconds, verdict)
    return Outcome(name, command, status, seconds, target)


def csv_table(path: Path, max_rows: int = MAX_ROWS) -> str:
    """A CSV file as a markdown table (first ``max_rows`` rows, then a note)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return f"*{path.name} is empty*\n"
    header, body = rows[0], rows[1:]
    cols = min(len(header), MAX_COLS)

    def cell(value: str) -> str:
        try:
            number = float(value)
        except ValueError:
            return value.replace("|", "\\|")
        if value.strip().lstrip("-").isdigit():
            return value
        return f"{number:.4g}"

    lines = ["| " + " | ".join(header[:cols]) + " |", "|" + "---|" * cols]
    for row in body[:max_rows]:
        lines.append("| " + " | ".join(cell(v) for v in row[:cols]) + " |")
    notes = []
    if len(body) > max_rows:
        notes.append(f"first {max_rows} of {len(body)} rows")
    if len(header) > cols:
        notes.append(f"first {cols} of {len(header)} columns")
    if notes:
        lines.append(
            f"\n*{', '.join(notes)}; full table: [{path.name}]({path.parent.name}/{path.name})*"
        )
    return "\n".join(lines) + "\n"


def _docstring_line(script: Path) -> str:
    import ast

    try:
        doc = ast.get_docstring(ast.parse(script.read_text()))
    except (SyntaxError, OSError):
        return ""
    return doc.strip().splitlines()[0] if doc else ""


def write_report(outcomes: list[Outcome], directory: Path, out: Path, quick: bool) -> Path:
    """Write ``out/REPORT.md``: per experiment, its command, status, PNGs and CSV tables."""
    mode = "quick mode (`--quick`)" if quick else "full mode"
    lines = [
        "# Experiment report",
        "",
        f"Generated by `schedir experiments{' --quick' if quick else ''}` in {mode} on "
        f"{time.strftime('%Y-%m-%d %H:%M')}; commands run from the repository root. "
        f"Total {sum(o.seconds for o in outcomes):.0f} s.",
        "",
        "| experiment | status | time |",
        "|---|---|---|",
    ]
    for o in outcomes:
        status = (
            "ok" if o.status == 0 else ("timeout" if o.status == -1 else f"failed ({o.status})")
        )
        lines.append(f"| [{o.name}](#{o.name.lower()}) | {status} | {o.seconds:.1f} s |")
    for o in outcomes:
        lines += ["", f"## {o.name}", ""]
        summary = _docstring_line(directory / f"{o.name}.py")
        if summary:
            lines += [summary, ""]
        lines += ["```bash", shlex.join(o.command), "```", ""]
        if o.status != 0:
            tail = (o.out / "log.txt").read_text().splitlines()[-15:]
            lines += [
                f"**Failed** (status {o.status}) after {o.seconds:.1f} s; "
                f"end of [log]({o.name}/log.txt):",
                "",
                "```",
                *tail,
                "```",
                "",
            ]
        for png in sorted(o.out.glob("*.png")):
            lines += [f"![{png.stem}]({o.name}/{png.name})", ""]
        for svg in sorted(o.out.glob("*.svg")):
            lines += [f"![{svg.stem}]({o.name}/{svg.name})", ""]
        for table in sorted(o.out.glob("*.csv")):
            lines += [f"**{table.name}**", "", csv_table(table)]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_all(
    names: list[str], directory: Path, out: Path, *, quick: bool, timeout: float | None = None
) -> list[str]:
    """Run ``names`` from ``directory``, write ``out/REPORT.md``; returns the failed names."""
    out.mkdir(parents=True, exist_ok=True)
    bar = _Bar(len(names))
    try:
        outcomes = [
            run_one(name, directory, out, quick=quick, timeout=timeout, bar=bar) for name in names
        ]
    finally:
        bar.close()
    path = write_report(outcomes, directory, out, quick)
    failed = [o.name for o in outcomes if o.status != 0]
    total = sum(o.seconds for o in outcomes)
    note = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"{len(outcomes)} experiments in {total:.0f} s{note}; report: {path}")
    return failed


def main(argv: list[str] | None = None, directory: Path | None = None) -> int:
    """``python -m paper_experiments [--quick] [--out results] [--timeout S] [NAME ...]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="paper_experiments", description=main.__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results")
    parser.add_argument("--timeout", type=float)
    args = parser.parse_args(argv)
    directory = directory or Path("paper_experiments")
    try:
        names = find_experiments(directory, args.names)
    except ValueError as err:
        print(f"paper_experiments: error: {err}", file=sys.stderr)
        return 2
    failed = run_all(names, directory, Path(args.out), quick=args.quick, timeout=args.timeout)
    return 1 if failed else 0
