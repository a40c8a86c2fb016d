"""How the processes of one job find each other: the environment contract (docs/multihost.md).

A job of N processes (one per host on a cluster, or N local CPU processes started by
``schedir launch``) runs the same script in every process. Each process reads, from
its environment:

- ``SCHEDIR_COORDINATOR``: ``host:port`` of process 0's coordination service;
- ``SCHEDIR_NUM_PROCESSES``: N;
- ``SCHEDIR_PROCESS_ID``: this process's rank, 0..N-1;
- ``SCHEDIR_LOCAL_DEVICES`` (optional): the devices this process should see; on CPU
  the launcher also sets ``XLA_FLAGS=--xla_force_host_platform_device_count=K``.

``jax_exec.distributed.initialize_from_env()`` turns them into
``jax.distributed.initialize``; ``schedir launch`` and the SLURM script of the docs
write them. This module only parses and formats them (no JAX here).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass

COORDINATOR = "SCHEDIR_COORDINATOR"
NUM_PROCESSES = "SCHEDIR_NUM_PROCESSES"
PROCESS_ID = "SCHEDIR_PROCESS_ID"
LOCAL_DEVICES = "SCHEDIR_LOCAL_DEVICES"


class ClusterEnvError(ValueError):
    """A process-group variable is missing or malformed (the message names it)."""


@dataclass(frozen=True)
class ProcessGroup:
    """One process's view of its job.

    Attributes:
        coordinator: ``host:port`` of the coordination service (on process 0).
        num_processes: processes in the job.
        process_id: this process, 0 .. num_processes - 1.
        local_devices: devices each process has (None: what the platform shows).
    """

    coordinator: str
    num_processes: int
    process_id: int
    local_devices: int | None = None

    def __post_init__(self) -> None:
        host, sep, port = self.coordinator.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ClusterEnvError(
                f"{COORDINATOR} = {self.coordinator!r}: expected host:port (port 1..65535)"
            )
        for name, value, low in (
            (NUM_PROCESSES, self.num_processes, 1),
            (PROCESS_ID, self.process_id, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise ClusterEnvError(f"{name} = {value!r}: expected an integer >= {low}")
        if self.process_id >= self.num_processes:
            raise ClusterEnvError(
                f"{PROCESS_ID} = {self.process_id}: expected < {NUM_PROCESSES} = "
                f"{self.num_processes}"
            )
        d = self.local_devices
        if d is not None and (isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1):
            raise ClusterEnvError(f"{LOCAL_DEVICES} = {d!r}: expected an integer >= 1")

    def to_env(self) -> dict[str, str]:
        """The variables that describe this process (to add to its environment)."""
        env = {
            COORDINATOR: self.coordinator,
            NUM_PROCESSES: str(self.num_processes),
            PROCESS_ID: str(self.process_id),
        }
        if self.local_devices is not None:
            env[LOCAL_DEVICES] = str(self.local_devices)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProcessGroup | None:
        """The group described by ``environ``; None when none of its variables is set
        (a single-process run); ClusterEnvError naming a missing or bad variable.

        >>> group = ProcessGroup.from_env({"SCHEDIR_COORDINATOR": "localhost:4242",
        ...     "SCHEDIR_NUM_PROCESSES": "2", "SCHEDIR_PROCESS_ID": "1"})
        >>> group.process_id, group.num_processes, group.local_devices
        (1, 2, None)
        >>> ProcessGroup.from_env({}) is None
        True
        """
        names = (COORDINATOR, NUM_PROCESSES, PROCESS_ID)
        if not any(n in environ for n in (*names, LOCAL_DEVICES)):
            return None
        missing = [n for n in names if not environ.get(n)]
        if missing:
            raise ClusterEnvError(f"{', '.join(missing)} not set (the others are)")
        ints = {}
        for name in (NUM_PROCESSES, PROCESS_ID, LOCAL_DEVICES):
            text = environ.get(name)
            if text is None:
                continue
            try:
                ints[name] = int(text)
            except ValueError:
                raise ClusterEnvError(f"{name} = {text!r}: expected an integer") from None
        return cls(
            environ[COORDINATOR],
            ints[NUM_PROCESSES],
            ints[PROCESS_ID],
            ints.get(LOCAL_DEVICES),
        )
