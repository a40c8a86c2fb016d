"""The automatic planner's scripts: examples/auto_schedule.py and
benchmarks/gpu_fidelity.py (CPU reduced mode) run in --quick mode (slow), and the HLO
instruction counter of gpu_fidelity against a function whose dots are known."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from figure_checks import check_saved, load_script, recorded

ROOT = Path(__file__).resolve().parents[2]


def test_hlo_counts_dots():
    fidelity = load_script("benchmarks/gpu_fidelity.py")
    w, x = jnp.ones((8, 8)), jnp.ones((4, 8))

    def one_dot(w, x):
        return x @ w

    text = jax.jit(one_dot).lower(w, x).compile().as_text()
    n, dots = fidelity.hlo_counts(text)
    assert dots == 1 and n >= 3

    def two_dots(w, x):
        return jnp.tanh(x @ w) @ w.T

    n, dots = fidelity.hlo_counts(jax.jit(two_dots).lower(w, x).compile().as_text())
    assert dots == 2


def _run(argv: list[str]) -> str:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_gpu_fidelity_reduced_mode(tmp_path: Path):
    out = _run(["benchmarks/gpu_fidelity.py", "--quick", "--out", str(tmp_path),
                "--models", "unet", "--points", "2", "--repeats", "1"])  # fmt: skip
    assert "reduced mode" in out and "cannot be shown" in out
    with open(tmp_path / "gpu_fidelity.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["plain", "auto", "auto"]
    assert all(r["measured_peak"] == "" for r in rows)  # no allocator peak on CPU


@pytest.mark.slow
def test_auto_schedule_example(tmp_path: Path, capsys, monkeypatch):
    figures = recorded(monkeypatch)
    example = load_script("examples/auto_schedule.py")
    assert example.main(["--quick", "--out", str(tmp_path), "--points", "2", "--steps", "2"]) == 0
    names = ("gpt", "resnet", "unet")
    check_saved(figures, *(f"auto_{kind}_{n}.png" for kind in ("schedule", "plan") for n in names))
    out = capsys.readouterr().out
    assert "checkpoint_dots" in out and "nothing_saveable" in out and ": equal" in out
