"""``schedir launch``: run one script as N local CPU processes of one JAX job (docs/multihost.md).

    schedir launch --processes 2 --devices-per-process 4 -- python train.py --steps 3

Process 0's coordination service listens on a free localhost port; every process gets
the :mod:`schedir.cluster` variables (its rank, the process count, the coordinator)
and ``XLA_FLAGS=--xla_force_host_platform_device_count=K`` with ``JAX_PLATFORMS=cpu``,
so the script's ``jax_exec.distributed.initialize_from_env()`` joins the job (gloo
collectives between the processes). Each output line is printed as it comes,
prefixed with ``[rank]``; the launcher waits for every process and exits 0 when all
exited 0. When one fails, the others get ``--grace`` seconds to stop on their own
(they are usually waiting on a collective that will never complete) and are then
killed; past ``--timeout`` seconds every process still running is killed. Either way
the exit status is 1 and a line names the process and what happened.

Only the standard library is imported: the launcher starts in milliseconds and never
initializes JAX itself.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from schedir.cluster import ProcessGroup
from schedir_cli.common import CLIError, positive_float, positive_int

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def free_port() -> int:
    """A TCP port free on localhost now (the OS picks it; another program could still
    take it before the coordinator binds it, which then fails with a clear error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def process_env(base: dict, group: ProcessGroup, devices: int) -> dict:
    """``base`` plus the group's variables, K forced CPU devices and the CPU platform
    (an existing device-count flag in XLA_FLAGS is replaced, other flags kept)."""
    flags = re.sub(rf"{DEVICE_FLAG}=\S*", "", base.get("XLA_FLAGS", "")).split()
    env = dict(base, **group.to_env())
    env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
    return env


def _pump(stream, rank: int, out, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            out.write(f"[{rank}] {line}" if line.endswith("\n") else f"[{rank}] {line}\n")
            out.flush()
    stream.close()


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill the process group of every child still running (each child was started in
    its own session, so what it started goes too) and reap them."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def launch(
    command: list[str],
    processes: int,
    devices: int = 1,
    *,
    timeout: float = 600.0,
    grace: float = 5.0,
    port: int | None = None,
    out=None,
) -> tuple[int, list[dict]]:
    """Run ``command`` as ``processes`` ranks; returns (status, one dict per rank with
    ``rank``, ``returncode`` (None if killed), ``seconds``, ``outcome``). Output lines
    go to ``out`` (default stdout), prefixed ``[rank]``; the summary to stderr."""
    out = sys.stdout if out is None else out
    if not command:
        raise CLIError("launch: no command given (schedir launch --processes N -- CMD ...)")
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise CLIError(f"launch: command {command[0]!r} not found")
    coordinator = f"localhost:{port or free_port()}"
    lock = threading.Lock()
    procs, pumps, start = [], [], time.monotonic()
    ended: dict[int, float] = {}
    try:
        for rank in range(processes):
            group = ProcessGroup(coordinator, processes, rank, devices)
            p = subprocess.Popen(
                command,
                env=process_env(dict(os.environ), group, devices),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, rank, out, lock), daemon=True)
            t.start()
            pumps.append(t)
        outcome: dict[int, str] = {}
        failed_at = None
        while len(ended) < processes:
            now = time.monotonic()
            for rank, p in enumerate(procs):
                if rank not in ended and p.poll() is not None:
                    ended[rank] = now - start
                    if p.returncode != 0 and failed_at is None:
                        failed_at = now
            if now - start > timeout:
                for rank in range(processes):
                    if rank not in ended:
                        outcome[rank] = f"timed out after {timeout:g} s (killed)"
                break
            if failed_at is not None and now - failed_at > grace:
                for rank in range(processes):
                    if rank not in ended:
                        outcome[rank] = "killed after another process failed"
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
        for t in pumps:
            t.join(timeout=5)
    rows = []
    for rank, p in enumerate(procs):
        code = p.returncode if rank in ended else None
        what = outcome.get(rank) or ("ok" if code == 0 else f"exited with status {code}")
        seconds = ended.get(rank, time.monotonic() - start)
        rows.append({"rank": rank, "returncode": code, "seconds": seconds, "outcome": what})
    status = 0 if all(r["returncode"] == 0 for r in rows) else 1
    return status, rows


def cmd_launch(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    status, rows = launch(
        command,
        args.processes,
        args.devices_per_process,
        timeout=args.timeout,
        grace=args.grace,
        port=args.port,
    )
    for r in rows:
        print(
            f"schedir launch: process {r['rank']}: {r['outcome']} ({r['seconds']:.1f} s)",
            file=sys.stderr,
        )
    if status:
        bad = [r for r in rows if r["returncode"] != 0]
        first = min(bad, key=lambda r: r["seconds"])
        raise CLIError(f"launch: process {first['rank']} {first['outcome']}", 1)
    return 0


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value}: expected a port 1..65535")
    return value


def add_launch_command(sub) -> None:
    """Add ``launch`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "launch",
        help="run a script as N local CPU processes of one JAX job",
        description="Start N local processes of COMMAND, joined by jax.distributed "
        "(jax_exec.distributed.initialize_from_env() in the script).",
    )
    p.add_argument("--processes", "-n", type=positive_int, required=True, help="processes")
    p.add_argument(
        "--devices-per-process", "-k", type=positive_int, default=1, help="CPU devices each"
    )
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds in all")
    p.add_argument(
        "--grace",
        type=positive_float,
        default=5.0,
        help="seconds the others may run after one failed",
    )
    p.add_argument("--port", type=_port, help="coordinator port (default: a free one)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=cmd_launch)
