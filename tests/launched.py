"""Run a test script as several processes of one JAX job (``schedir launch``) and read
the JSON report each process prints as its last ``{...}`` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch_reports(script: str, *, processes: int = 2, devices_per_process: int = 4,
                   timeout: int = 300, path: tuple = ()) -> dict[int, dict]:  # fmt: skip
    """``script`` under ``schedir launch`` (``path``: more PYTHONPATH entries after the
    repository root); asserts it succeeded and that every process reported; the
    reports by process rank."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, path)]))
    proc = subprocess.run(
        [sys.executable, "-m", "schedir_cli", "launch", "--processes", str(processes),
         "--devices-per-process", str(devices_per_process), "--timeout", str(timeout), "--",
         sys.executable, script],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    reports = {}
    for line in proc.stdout.splitlines():
        rank, _, text = line.partition("] ")
        if text.startswith("{"):
            reports[int(rank.lstrip("["))] = json.loads(text)
    assert set(reports) == set(range(processes)), proc.stdout[-3000:]
    return reports
