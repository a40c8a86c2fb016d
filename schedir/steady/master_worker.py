"""The master-worker steady-state problem (docs/pipelines.md, "Master-worker").

Banino, Beaumont, Carter, Dongarra, Legrand and Robert, "Scheduling strategies for
master-slave tasking on heterogeneous processor platforms", IEEE TPDS 15(4), 2004.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from schedir.errors import InvalidProblem
from schedir.platform import Platform, check_bytes, check_number


@dataclass(frozen=True)
class MasterWorker:
    """Independent equal tasks served from a master over a star or tree (one-port).

    Banino et al., "Scheduling strategies for master-slave tasking on heterogeneous
    processor platforms", IEEE TPDS 15(4), 2004. Every node (the master included) may
    compute, receive from its parent, and send to one child at a time, all overlapped.

    Attributes:
        platform: devices and the (directed) links of a tree rooted at ``master``.
        master: name of the root, which holds the tasks.
        work: seconds per task at speed 1 (node u takes work / speed_u).
        task_bytes: bytes of one task's input, sent from the parent to the child.
        master_computes: whether the master computes tasks too.
    """

    platform: Platform
    master: str
    work: float
    task_bytes: int
    master_computes: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.platform, Platform):
            raise InvalidProblem(f"platform = {self.platform!r}: expected a Platform")
        self.platform.device(self.master)
        # zero work would make the throughput unbounded
        work = check_number("work", self.work, zero=False, divisor=True, what="time (s)")
        object.__setattr__(self, "work", work)
        object.__setattr__(self, "task_bytes", check_bytes("task_bytes", self.task_bytes))
        if not isinstance(self.master_computes, bool):
            raise InvalidProblem(f"master_computes = {self.master_computes!r}: expected a bool")

    def children(self) -> dict[str, list[str]]:
        """The tree: children of every node, following links away from the master."""
        kids: dict[str, list[str]] = {d.name: [] for d in self.platform.devices}
        seen, frontier = {self.master}, [self.master]
        while frontier:
            u = frontier.pop()
            for link in self.platform.links:
                if link.src == u and link.dst not in seen:
                    seen.add(link.dst)
                    kids[u].append(link.dst)
                    frontier.append(link.dst)
        return kids

    def comm_time(self, parent: str, child: str) -> float:
        """Seconds to send one task from parent to child."""
        return self.platform.link(parent, child).time(self.task_bytes)

    def compute_time(self, name: str) -> float:
        """Seconds one task takes on ``name`` (inf for a master that does not compute)."""
        if name == self.master and not self.master_computes:
            return math.inf
        return self.work / self.platform.device(name).speed


@dataclass(frozen=True)
class SteadyState:
    """A steady-state solution: tasks per second computed on and sent to each node.

    Attributes:
        throughput: tasks per second, in total.
        compute: tasks per second computed by each node.
        send: tasks per second sent over each link (parent, child).
        meta: method, solve time, ...
    """

    throughput: float
    compute: dict
    send: dict
    meta: dict = field(default_factory=dict)
