"""Fuzz the command line and the Python API with malformed problems, schedules and budgets.

Issue 11's acceptance: over thousands of seeded cases (``tests/fuzz_inputs.py``), the
CLI never exits with status 3 (internal error) or prints a traceback without
``--debug``, and the API (``schedir.from_dict``/``load``, ``schedir.simulate``,
``solvers.solve`` with every method of the problem's kind) raises nothing but typed
input errors (``ValueError``/``TypeError`` subclasses: ``InvalidProblem``,
``InvalidSchedule``, ``solvers.Infeasible``, ...), never an ``IndexError``,
``AttributeError``, ``OverflowError``, ``RecursionError``, a rejected solver answer
(``RuntimeError``) or a non-finite makespan.

The CLI runs in process (``schedir_cli.main``), a few cases in a subprocess.
``SCHEDIR_FUZZ_CASES`` sets the number of cases (default 2,400, under a minute),
``SCHEDIR_FUZZ_SEED`` the seed (default 11), ``SCHEDIR_FUZZ_NOTES=1`` prints the exit
statuses and the shape errors the loader caught (run with ``-s``).
A failure lists each finding: the input, the exception and where it was raised.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import fuzz_inputs as fz
import pytest

import schedir
import solvers
from schedir_cli.app import main

ROOT = Path(__file__).resolve().parents[2]
CASES = int(os.environ.get("SCHEDIR_FUZZ_CASES", "2400"))
SEED = int(os.environ.get("SCHEDIR_FUZZ_SEED", "11"))
SECONDS_PER_CALL = 20  # slower on these tiny problems is a finding (a cold cvxpy/HiGHS
# first call takes 3 s here, more on a loaded machine)

# Python's own messages for a TypeError/ValueError that no check of ours raised: an
# input reached code that assumed another type (a finding, not a typed input error).
ACCIDENTAL = (
    "object is not subscriptable", "unsupported operand", "not supported between",
    "object is not iterable", "object cannot be interpreted", "invalid literal for int",
    "could not convert string to float", "cannot convert float", "math domain error",
    "unhashable type", "must be real number", "object has no len", "positional argument",
    "keyword argument", "not enough values to unpack", "too many values to unpack",
)  # fmt: skip


# Typed refusals: what a caller can catch and show as a one-line error. (A solver that
# does not handle an input kind says so with NotImplementedError and the way to go.)
TYPED = (schedir.InvalidProblem, schedir.InvalidSchedule, solvers.Infeasible, NotImplementedError)


class Slow(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    def stop(signum, frame):
        raise Slow(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    # fire again every 0.5 s: an exception raised inside a gc callback is swallowed
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def origin(err: BaseException) -> str:
    """``file:line`` (repository-relative) of the innermost frame in the repository."""
    frames = [
        f for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(str(ROOT))
    ]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{Path(f.filename).relative_to(ROOT)}:{f.lineno}"


class Fuzz:
    def __init__(self, seed: int, tmp: Path) -> None:
        self.rng = random.Random(seed)
        self.seeds = fz.seeds()
        self.tmp = tmp
        self.findings: dict[tuple, str] = {}  # (where, type, message head) -> one example
        self.statuses: dict[int, int] = {}  # CLI exit status -> cases
        self.notes: dict[tuple, str] = {}  # typed, but the message does not name the field
        self.cases = 0
        self.described: list[str] = []  # the files of the current CLI case

    # ------------------------------------------------------------ bookkeeping

    def found(self, what: str, err: BaseException | None, detail: str, where: str = "") -> None:
        kind = type(err).__name__ if err is not None else "bad result"
        message = (str(err).splitlines() or [""])[0][:120] if err is not None else ""
        where = where or (origin(err) if err is not None else "?")
        key = (what, where, kind, message[:50])
        self.findings.setdefault(key, f"{what}: {kind}: {message} at {where}\n    input: {detail}")

    def api(self, what: str, detail: str, call):
        """Run one API call; record anything but a typed input error."""
        self.cases += 1
        try:
            with deadline(SECONDS_PER_CALL):
                return call()
        except Slow as err:
            self.found(what, err, detail, "(timeout)")
        except TYPED as err:
            if "malformed (" in str(err):  # a shape error the loader caught for a from_dict
                key = (type(err).__name__, str(err)[:90])
                self.notes.setdefault(key, f"{what}: {err}\n    input: {detail}")
        except (ValueError, TypeError) as err:
            if any(text in str(err) for text in ACCIDENTAL):
                self.found(what, err, detail)
        except Exception as err:  # noqa: BLE001 - the point of the test
            self.found(what, err, detail)
        return None

    # ------------------------------------------------------------ the Python API

    def variant(self, name: str, p_mutate: float) -> tuple[dict, str]:
        """The seed ``name``, mutated with probability ``p_mutate``, and what changed."""
        seed = self.seeds[name]
        tree = fz.mutate(self.rng, seed) if self.rng.random() < p_mutate else seed
        return tree, f"the {name} seed with {fz.changes(seed, tree) or 'no change'}"

    def api_case(self) -> None:
        name = self.rng.choice(list(self.seeds))
        tree, detail = self.variant(name, 0.85)
        obj = self.api("from_dict", detail, lambda: schedir.from_dict(tree))
        if obj is None or "schedule" in name or isinstance(obj, schedir.Platform):
            return
        schedule_names = [n for n in self.seeds if n.endswith("schedule")]
        for _ in range(2):
            stree, sdetail = self.variant(self.rng.choice(schedule_names), 0.5)
            schedule = self.api("from_dict", sdetail, lambda t=stree: schedir.from_dict(t))
            if schedule is None:
                continue
            trace = self.api(
                "simulate",
                f"problem: {detail}; schedule: {sdetail}",
                lambda s=schedule: schedir.simulate(obj, s),
            )
            if trace is not None and not math.isfinite(trace.makespan):
                where = "(non-finite makespan)"
                self.found("simulate", None, f"makespan {trace.makespan}: {detail}", where)
        for method in solvers.available(obj):
            budget = fz.budget_value(self.rng)
            if method.problem is schedir.PipelineProblem and self.rng.random() < 0.5:
                budget = None
            result = self.api(
                f"solve({method.name})",
                f"budget {budget!r}; problem: {detail}",
                lambda m=method.name, b=budget: solvers.solve(obj, b, m),
            )
            makespan = getattr(result, "meta", {}).get("makespan") if result is not None else None
            if isinstance(makespan, float) and not math.isfinite(makespan):
                where = "(non-finite makespan)"
                self.found(f"solve({method.name})", None, f"makespan {makespan}: {detail}", where)

    # ------------------------------------------------------------ the command line

    def write(self, name: str, tree_or_text) -> Path:
        path = self.tmp / name
        if isinstance(tree_or_text, str):
            path.write_text(tree_or_text, encoding="utf-8", errors="surrogatepass")
        else:
            path.write_text(json.dumps(tree_or_text))
        return path

    def problem_file(self, name: str) -> Path:
        if self.rng.random() < 0.85:
            tree, detail = self.variant(name, 0.5)
            self.described.append(f"p.json: {detail}")
            return self.write("p.json", tree)
        text = fz.broken_text(self.rng, json.dumps(self.seeds[name]))
        self.described.append(f"p.json: {text[:200]!r}")
        return self.write("p.json", text)

    def schedule_file(self, name: str, problem: Path) -> Path:
        tree, detail = self.variant(name, 0.5)
        if isinstance(tree.get("meta"), dict) and self.rng.random() < 0.7:
            tree = {**tree, "meta": {**tree["meta"], "problem": problem.name}}
        if self.rng.random() < 0.1:
            text = fz.broken_text(self.rng, json.dumps(tree))
            self.described.append(f"s.json: {text[:200]!r}")
            return self.write("s.json", text)
        self.described.append(f"s.json: {detail}")
        return self.write("s.json", tree)

    # problem seed -> (its schedule seed, its methods); half the CLI cases are coherent
    KINDS = {
        "chain": ("chain_schedule", ["rotor", "chen_sqrt", "revolve", "store_all", "all"]),
        "graph": ("graph_schedule", ["dtr", "checkmate_milp", "checkmate_lp", "chen_sqrt"]),
        "offload": ("offload_schedule", ["rotor_offload", "offload_greedy", "all"]),
        "pipeline": ("pipeline_schedule", ["pipeline_dp", "pipeline_greedy", "eager"]),
        "platform": ("chain_schedule", ["rotor"]),
    }

    def argv(self) -> list[str]:
        rng = self.rng
        command = rng.choice(["solve"] * 5 + ["simulate"] * 3 + ["show", "tradeoff", "methods"])
        name = rng.choice(["chain", "chain", "graph", "offload", "pipeline", "platform"])
        coherent = rng.random() < 0.5
        schedule_name, methods = self.KINDS[name]
        if not coherent:
            schedule_name = rng.choice([n for n in self.seeds if n.endswith("schedule")])
            methods = ["rotor", "all", "dtr", "checkmate_milp", "rotor_offload", "pipeline_dp",
                       "store_all", "chen_sqrt", "nope"]  # fmt: skip
        if schedule_name not in self.seeds:
            schedule_name = "chain_schedule"
        problem = self.problem_file(name)
        if command == "solve":
            argv = ["solve", str(problem), "-b", fz.budget_text(rng), "-m", rng.choice(methods)]
            argv += rng.choice(
                [[], [], ["--json"], ["--show"], ["--as-graph"] if not coherent else [],
                 ["-o", "model=tight"], ["-o", "x=1"], ["--show", "--width", "3"]]
            )  # fmt: skip
            return argv
        if command in ("simulate", "show"):
            schedule = self.schedule_file(schedule_name, problem)
            if command == "simulate":
                extra = rng.choice([[], ["--json"], ["--json", "--trace"], ["--trace"]])
                return ["simulate", str(problem), str(schedule), *extra]
            return ["show", str(schedule), *rng.choice([[], ["--problem", str(problem)]])]
        if command == "tradeoff":
            method = rng.choice([m for m in methods if m != "all"] or ["rotor"])
            bounds = rng.choice(
                [[], ["--from", fz.budget_text(rng)], ["--to", fz.budget_text(rng)]]
            )
            return ["tradeoff", str(problem), "-m", method, "--points", "3", *bounds, "--json"]
        return ["methods", str(problem)]

    def cli_case(self) -> None:
        self.described = []
        argv = self.argv()
        self.cases += 1
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with deadline(SECONDS_PER_CALL):
                    status = main(list(argv))
            except Slow as slow:
                self.found("cli", slow, " ".join(argv), "(timeout)")
                return
        stderr, stdout = err.getvalue(), out.getvalue()
        self.statuses[status] = self.statuses.get(status, 0) + 1
        shown = " ".join(Path(a).name if a.startswith(str(self.tmp)) else a for a in argv)
        detail = f"schedir {shown}; {'; '.join(self.described)}"
        if status == 3 or "Traceback" in stderr:
            self.found("cli", self.debug(argv), detail, "")
        elif status not in (0, 1, 2):
            self.found("cli", None, f"exit {status}: {detail}")
        elif status != 0 and stderr.strip():  # --method all with no schedule: 1, a table
            if not stderr.strip().splitlines()[-1].startswith("schedir: error: "):
                self.found("cli", None, f"not a one-line error ({stderr[-200:]!r}): {detail}")
        elif status == 2:
            self.found("cli", None, f"exit 2 without a message: {detail}")
        if any(bad in stdout for bad in ("Infinity", "NaN", " inf ", " nan ")):
            self.found("cli", None, f"non-finite number in the output: {detail}")

    def debug(self, argv: list[str]) -> BaseException:
        """The exception behind an internal error (rerun with --debug)."""
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                main([*argv, "--debug"])
            except BaseException as err:  # noqa: BLE001
                return err
        return RuntimeError("exit 3 without an exception under --debug")

    def run(self, cases: int) -> None:
        while self.cases < cases:
            if self.rng.random() < 0.5:
                self.api_case()
            else:
                self.cli_case()

    def report(self, notes: bool = False) -> str:
        entries = self.notes if notes else self.findings
        what = "shape errors caught by the loader" if notes else "findings"
        return f"{len(entries)} {what} in {self.cases} cases:\n" + "\n".join(
            sorted(entries.values())
        )


def test_fuzz_cli_and_api(tmp_path: Path) -> None:
    fuzz = Fuzz(seed=SEED, tmp=tmp_path)
    fuzz.run(CASES)
    if os.environ.get("SCHEDIR_FUZZ_NOTES"):
        print(fuzz.report(notes=True), "\nCLI exit statuses:", fuzz.statuses)
    assert fuzz.cases >= min(CASES, 2000)
    assert not fuzz.findings, fuzz.report()


@pytest.mark.parametrize("index", range(4))
def test_fuzz_cli_in_a_subprocess(tmp_path: Path, index: int) -> None:
    """The real process: broken files give exit 2 and one line, never a traceback."""
    rng = random.Random(100 + index)
    seeds = fz.seeds()
    problem = tmp_path / "p.json"
    problem.write_text(fz.broken_text(rng, json.dumps(seeds["chain"])))
    schedule = tmp_path / "s.json"
    schedule.write_text(json.dumps(fz.mutate(rng, seeds["chain_schedule"])))
    argv = [
        ["solve", str(problem), "-b", fz.budget_text(rng)],
        ["simulate", str(problem), str(schedule)],
        ["show", str(schedule), "--problem", str(problem)],
        ["solve", str(problem), "-b", "1e400"],
    ][index]
    proc = subprocess.run(
        [sys.executable, "-m", "schedir_cli", *argv], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode in (0, 1, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    if proc.returncode:
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("schedir: error: ")
