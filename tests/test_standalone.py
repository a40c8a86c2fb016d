"""The repository stands alone (no reference to a design file outside it), and so does
its wheel: built, installed into a fresh environment and run from another folder, the
``schedir`` command answers without the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# spelled in two parts so that this file too passes `grep -rn` for the word
WORD = "DES" + "IGN"
PACKAGES = ("schedir", "solvers", "jax_exec", "schedir_cli")


def test_no_reference_to_an_outside_design_document() -> None:
    hits = []
    for folder in (*PACKAGES, "docs", "tests", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md"):
                text = path.read_text(errors="replace")
                hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in
                         enumerate(text.splitlines(), 1) if WORD in line]  # fmt: skip
    readme = (ROOT / "README.md").read_text()
    assert WORD not in readme
    assert not hits, hits


def _old_build_backend() -> str | None:
    """Why this interpreter cannot build the wheel without downloading (its setuptools
    is older than [build-system] requires), or None."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for text in pyproject["build-system"]["requires"]:
        need = Requirement(text)
        try:
            have = version(need.name)
        except PackageNotFoundError:
            return f"{need.name} is not installed: `make` installs it (the test extra)"
        if not need.specifier.contains(have, prereleases=True):
            return (
                f"{need.name} {have} here, [build-system] requires {need}: `make` installs "
                "it (the test extra)"
            )
    return None


def _run(argv: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_stands_alone(tmp_path: Path) -> None:
    """``pip wheel`` (no download: this environment's setuptools), installed without
    dependencies into a fresh venv that sees this environment's site-packages (jax,
    cvxpy, ...) but not the checkout; from another folder: the help names installed
    docs, ``methods``, ``profile`` then ``solve`` of the profiled problem (the first
    steps of docs/cli.md), and ``experiments`` says it needs a checkout."""
    why = _old_build_backend()
    if why:
        pytest.skip(why)
    source = _mkdir(tmp_path / "source")  # a copy: building writes build/ and *.egg-info
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in (*PACKAGES, "docs"):
        shutil.copytree(ROOT / folder, source / folder, ignore=skip)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "--no-index", "-w", str(wheels), str(source)]  # fmt: skip
    proc = _run(build, tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = wheels.glob("schedir-*.whl")

    venv = tmp_path / "venv"
    proc = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                tmp_path, env).stdout.strip()  # fmt: skip
    # this environment's packages, after the venv's own: plain path lines, so that its
    # .pth files (the editable install of the checkout) are not read
    outer = [p for p in sys.path if "-packages" in p and Path(p).is_dir()]
    Path(site, "outer_environment.pth").write_text("\n".join(outer) + "\n")
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    proc = _run(install, tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    elsewhere = _mkdir(tmp_path / "elsewhere")
    schedir = str(venv / "bin" / "schedir")
    where = _run([python, "-c", "import schedir, schedir_cli; print(schedir_cli.__file__)"],
                 elsewhere, env)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr

    proc = _run([schedir, "--help"], elsewhere, env)
    assert proc.returncode == 0, proc.stderr
    docs = proc.stdout.split("\nDocs: ", 1)[1].splitlines()[0]
    assert Path(docs).is_file() and Path(docs).is_relative_to(venv), docs
    assert "## From an installed wheel" in Path(docs).read_text()

    proc = _run([schedir, "methods"], elsewhere, env)
    assert proc.returncode == 0 and "rotor" in proc.stdout, proc.stderr
    argv = ["profile", "--model", "mlp", "--depth", "2", "--batch", "8", "--out", "p/mlp.json"]
    proc = _run([schedir, *argv], elsewhere, env)
    assert proc.returncode == 0, proc.stderr
    assert "created folder p" in proc.stderr and (elsewhere / "p" / "mlp.json").is_file()
    argv = ["solve", "p/mlp.json", "--budget", "70%", "--method", "all", "--json"]
    proc = _run([schedir, *argv], elsewhere, env)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["format"] == "schedir.cli.solve" and answer["kind"] == "chain"
    labels = {r["method"]: r["label"] for r in answer["results"]}
    assert labels["rotor"] == "optimal" and labels["store_all"] is None  # 70%: infeasible

    proc = _run([schedir, "experiments", "--quick"], elsewhere, env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1 and "checkout" in proc.stderr, proc.stderr


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
