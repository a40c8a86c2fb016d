"""Several devices: pipeline problems, interval mappings and their period model (docs/pipelines.md).

A :class:`PipelineProblem` is a Chain cut into consecutive intervals, each placed on
one device or replicated on several (round-robin, which keeps outputs in order). The
analytical model, reproduced exactly by the discrete-event simulator
(:mod:`schedir.pipeline_sim`) at zero noise, is documented in ``docs/pipelines.md``:

- interval [i, j) on replicas R (a_i in, a_j out) with work W = sum fwd_time[i:j]:
  period max_{u in R} (W / speed_u) / |R|;
- boundary j between intervals on R and R': each directed link (u, v) is a serial
  resource; item n goes from R[n mod |R|] to R'[n mod |R'|], so every used pair carries
  one item out of lcm(|R|, |R'|), each taking latency + x_j / bandwidth. Its period is
  max over used pairs of that time / lcm(|R|, |R'|);
- period of the mapping = the max of these; latency = sum along the path of the
  slowest replica's time and the slowest used link's time.

References: Subhlok and Vondran (SPAA 1996) and Benoit and Robert (JPDC 2008) for
interval mappings with replication. The master-worker problem (:class:`MasterWorker`)
lives in :mod:`schedir.master_worker` and is re-exported here.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from schedir.chain.problem import Chain
from schedir.errors import InvalidProblem
from schedir.pipeline.master_worker import MasterWorker, SteadyState  # noqa: F401 (re-exported)
from schedir.platform import Platform, check_bytes, check_number


@dataclass(frozen=True)
class PipelineProblem:
    """A chain to pipeline over the devices of a platform.

    Attributes:
        chain: the stages; for inference only ``fwd_time`` and ``in_size`` matter
            (plus ``fwd_tmp`` for memory); for training also the backward fields.
        weights: bytes of the parameters of each stage (length L). Count gradients and
            optimizer state here too if they live on the device.
        platform: devices (speed, memory) and links.
        microbatches: micro-batches per training step (training), or items simulated
            by default (inference).
        training: False: a stream of inference inputs; True: 1F1B / GPipe training.
    """

    chain: Chain
    weights: tuple[int, ...]
    platform: Platform
    microbatches: int = 8
    training: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.chain, Chain):
            raise InvalidProblem(f"chain = {self.chain!r}: expected a Chain")
        if not isinstance(self.platform, Platform):
            raise InvalidProblem(f"platform = {self.platform!r}: expected a Platform")
        L = self.chain.length
        try:
            weights = tuple(self.weights)
        except TypeError:
            raise InvalidProblem(f"weights = {self.weights!r}: expected a list of bytes") from None
        if len(weights) != L:
            raise InvalidProblem(
                f"weights: expected {L} byte counts (one per stage), got {len(weights)}"
            )
        for k, w in enumerate(weights):
            check_bytes(f"weights[{k}]", w)
        object.__setattr__(self, "weights", tuple(int(w) for w in weights))
        # every time and size the models add, multiply or divide stays finite
        c = self.chain
        for name in ("fwd_time", "bwd_time"):
            for k, t in enumerate(getattr(c, name)):
                check_number(f"chain {name}[{k}]", t, what="time (s)")
        for name in ("in_size", "saved_size", "fwd_tmp", "bwd_tmp"):
            for k, n in enumerate(getattr(c, name)):
                check_bytes(f"chain {name}[{k}]", n)
        if not self.platform.devices:
            raise InvalidProblem("pipeline problem: the platform lists no devices")
        m = self.microbatches
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise InvalidProblem(f"microbatches = {m!r}: expected an integer >= 1")
        object.__setattr__(self, "microbatches", int(m))
        if not isinstance(self.training, bool):
            raise InvalidProblem(f"training = {self.training!r}: expected true or false")

    @property
    def length(self) -> int:
        return self.chain.length

    def work(self, i: int, j: int) -> float:
        """Seconds (at speed 1) of the forward of stages i..j-1 (inference) or of
        forward + backward (training; the loss counts in the last interval)."""
        c = self.chain
        w = sum(c.fwd_time[i:j])
        if self.training:
            w += sum(c.bwd_time[i:j])
            if j == c.length:
                w += c.fwd_time[-1] + c.bwd_time[-1]
        return w

    def to_dict(self) -> dict:
        return {
            "format": "schedir.pipeline",
            "version": 1,
            "chain": self.chain.to_dict(),
            "weights": list(self.weights),
            "platform": self.platform.to_dict(),
            "microbatches": self.microbatches,
            "training": self.training,
        }

    @classmethod
    def from_dict(cls, d: dict) -> PipelineProblem:
        if not isinstance(d, dict) or d.get("format") != "schedir.pipeline":
            raise InvalidProblem("expected a JSON object with format 'schedir.pipeline'")
        if d.get("version", 1) != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        for key in ("chain", "weights", "platform"):
            if key not in d:
                raise InvalidProblem(f"pipeline problem: missing field {key!r}")
        if not isinstance(d["weights"], list):
            raise InvalidProblem(f"weights = {d['weights']!r}: expected a list of bytes")
        return cls(
            Chain.from_dict(d["chain"]),
            tuple(d["weights"]),
            Platform.from_dict(d["platform"]),
            d.get("microbatches", 8),
            d.get("training", False),
        )


@dataclass(frozen=True)
class Interval:
    """Stages [first, last) placed on ``devices`` (round-robin in this order)."""

    first: int
    last: int
    devices: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in ("first", "last"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidProblem(f"interval {name} = {v!r}: expected a stage index")
        if isinstance(self.devices, str) or not all(isinstance(u, str) for u in self.devices):
            raise InvalidProblem(f"interval devices = {self.devices!r}: expected device names")
        object.__setattr__(self, "devices", tuple(self.devices))
        if not 0 <= self.first < self.last or not self.devices:
            raise InvalidProblem(f"interval {self}: expected first < last and >= 1 device")

    def __str__(self) -> str:
        return f"[{self.first}:{self.last})@{'+'.join(self.devices)}"


@dataclass(frozen=True)
class Mapping:
    """Consecutive intervals covering stages 0..L-1, on disjoint device sets."""

    intervals: tuple[Interval, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "intervals", tuple(self.intervals))

    def check(self, problem: PipelineProblem) -> None:
        """InvalidProblem unless this is an interval mapping of ``problem``."""
        pos, used = 0, set()
        for iv in self.intervals:
            if iv.first != pos:
                raise InvalidProblem(f"mapping: interval {iv} does not start at stage {pos}")
            pos = iv.last
            for name in iv.devices:
                problem.platform.device(name)
                if name in used:
                    raise InvalidProblem(f"mapping: device {name!r} is used twice")
                used.add(name)
        if pos != problem.length:
            raise InvalidProblem(f"mapping covers stages 0..{pos - 1}, not 0..{problem.length - 1}")

    def to_dict(self) -> list:
        return [[iv.first, iv.last, list(iv.devices)] for iv in self.intervals]

    @classmethod
    def from_dict(cls, d: Sequence) -> Mapping:
        try:
            return cls(tuple(Interval(a, b, tuple(devs)) for a, b, devs in d))
        except (TypeError, ValueError) as err:
            if isinstance(err, InvalidProblem):
                raise
            raise InvalidProblem(
                f"mapping {d!r}: expected [[first, last, [devices]], ...]"
            ) from None

    def __str__(self) -> str:
        return " ".join(str(iv) for iv in self.intervals)


def used_pairs(left: Sequence[str], right: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs (sender, receiver) used by round-robin on both sides: one item each per lcm."""
    a, b = len(left), len(right)
    return sorted({(left[n % a], right[n % b]) for n in range(math.lcm(a, b))})


def link_time(problem: PipelineProblem, src: str, dst: str, nbytes: int) -> float:
    """Seconds a message of ``nbytes`` occupies link src -> dst (inf if there is none)."""
    link = problem.platform.find_link(src, dst)
    return math.inf if link is None else link.time(nbytes)


@dataclass(frozen=True)
class PeriodReport:
    """The analytical model of one mapping.

    Attributes:
        period: seconds per item in steady state (max of all resource periods).
        latency: seconds one item takes through an empty pipeline (slowest path).
        compute: period of each interval, seconds.
        links: period of each boundary between consecutive intervals, seconds.
        memory: bytes needed on each device (:func:`mapping_memory`), an upper bound
            of the simulated peak when items are released at the period.
        fits: whether every device's memory (and the budget, if given) holds it.
    """

    period: float
    latency: float
    compute: tuple[float, ...]
    links: tuple[float, ...]
    memory: dict
    fits: bool


def working_set(problem: PipelineProblem, i: int, j: int, backward: bool = False) -> int:
    """Bytes live inside one op on stages [i, j) besides its input and output: the
    largest temporary (fwd_tmp or bwd_tmp) plus the activations between stages."""
    c = problem.chain
    x, tmp = c.in_size, (c.bwd_tmp if backward else c.fwd_tmp)
    return max(
        tmp[k] + (x[k] if k > i else 0) + (x[k + 1] if k + 1 < j else 0) for k in range(i, j)
    )


def interval_memory(
    problem: PipelineProblem, i: int, j: int, inputs: int = 2, outputs: int = 2
) -> int:
    """Bytes one replica of inference interval [i, j) needs when it holds at most
    ``inputs`` copies of a_i and ``outputs`` copies of a_j at once: its weights, the
    op's working set, ``inputs`` x_i (x_0 once: the source hands it over when the op
    starts) and ``outputs`` x_j (none when j == L: the last output leaves at once).
    The counts of a mapping come from :func:`buffer_counts` (2 and 2 without
    replication)."""
    L, x = problem.length, problem.chain.in_size
    held_in = (inputs if i > 0 else 1) * x[i]
    held_out = outputs * x[j] if j < L else 0
    return sum(problem.weights[i:j]) + working_set(problem, i, j) + held_in + held_out


def _spread(times: Sequence[float]) -> float:
    """1 - min / max of non-negative times (0 when all are 0; 1 when one is infinite)."""
    lo, hi = min(times), max(times)
    if hi == 0:
        return 0.0
    return 1.0 if math.isinf(hi) else 1.0 - lo / hi


def _ceil(value: float) -> int:
    """ceil of a non-negative ratio of float sums, forgiving rounding (1e-9)."""
    return max(0, math.ceil(value - 1e-9))


def buffer_counts(
    problem: PipelineProblem, intervals: Sequence[Interval], next_replicas: int | None = None
) -> list[tuple[int, int]]:
    """(copies of a_i, copies of a_j) a replica of each interval may hold at once when
    items are released at the period T (docs/pipelines.md, "Memory").

    Replica v of interval g (r_g replicas) gets one item every r_g T; an item's input
    lives from the start of its transfer to the end of the op, its output from the
    start of the op to the end of its send. Every resource serves its items in order
    at most as slowly as the period allows (an interval's replica within r T, a link
    within lcm(r, r') T), so an item reaches each point at most the slowest path's
    time after its release and at least the fastest path's time. The number of an
    interval's items alive at once is then at most ceil(spread / (r_g T)), where the
    spread is the difference of those two times: the transfer (at most lcm T, i.e.
    f_in = r_{g-1} / gcd(r_{g-1}, r_g) items; the senders feeding one replica) plus
    the op (at most r_g T, one item) plus, for every upstream interval h whose
    replicas differ in speed, r_h T (1 - s_min / s_max), and for every upstream
    boundary whose links differ, lcm T (1 - t_min / t_max) over all pairs. Without
    replication every count is 2, as when the input in use and the next one being
    received are held.

    ``intervals`` may stop before stage L (a prefix being built); the interval after
    it then has ``next_replicas`` replicas.
    """
    L, x = problem.length, problem.chain.in_size
    plat = problem.platform
    reps = [len(iv.devices) for iv in intervals]
    counts = []
    h_in = h_out = 0.0  # upstream heterogeneity, in units of T
    for g, iv in enumerate(intervals):
        r = reps[g]
        if g == 0:
            n_in = 1
        else:
            n_in = reps[g - 1] // math.gcd(reps[g - 1], r) + 1 + _ceil(h_in / r)
        if iv.last == L:
            n_out = 0
        else:
            nxt = reps[g + 1] if g + 1 < len(intervals) else next_replicas
            if nxt is None:
                raise ValueError("buffer_counts: a prefix needs next_replicas")
            n_out = nxt // math.gcd(r, nxt) + 1 + _ceil(h_out / r)
        counts.append((n_in, n_out))
        # what interval g adds to the spread of the intervals after it
        speeds = [plat.device(u).speed for u in iv.devices]
        h_compute = r * (1.0 - min(speeds) / max(speeds))
        h_link = 0.0
        if g + 1 < len(intervals):
            nxt_devs = intervals[g + 1].devices
            times = [link_time(problem, u, v, x[iv.last]) for u in iv.devices for v in nxt_devs]
            h_link = math.lcm(r, len(nxt_devs)) * _spread(times)
        h_in = h_out + h_compute
        h_out = h_out + h_compute + h_link
    return counts


def mapping_memory(
    problem: PipelineProblem, intervals: Sequence[Interval], next_replicas: int | None = None
) -> list[int]:
    """Bytes a replica of each interval needs (:func:`interval_memory` with the counts
    of :func:`buffer_counts`); an upper bound of the simulator's peak at the period."""
    counts = buffer_counts(problem, intervals, next_replicas)
    return [interval_memory(problem, iv.first, iv.last, *c)
            for iv, c in zip(intervals, counts, strict=True)]  # fmt: skip


def capacity(problem: PipelineProblem, name: str, budget: int | None = None) -> int | None:
    """Bytes device ``name`` may hold: its memory, and ``budget`` if given (None: no limit)."""
    caps = [c for c in (problem.platform.device(name).memory, budget) if c is not None]
    return min(caps) if caps else None


def boundary_period(
    problem: PipelineProblem, k: int, left: Sequence[str], right: Sequence[str], pairs: str = "used"
) -> tuple[float, float]:
    """(period, one-item time) of the links carrying a_k from replicas ``left`` to ``right``.

    ``pairs="used"`` takes the pairs round-robin really uses (exact for this order);
    ``pairs="all"`` takes every pair of left x right (an order-free upper bound, equal
    to "used" when gcd(|left|, |right|) = 1 or links are identical).
    """
    nbytes = problem.chain.in_size[k]
    chosen = used_pairs(left, right) if pairs == "used" else list(itertools.product(left, right))
    worst = max(link_time(problem, u, v, nbytes) for u, v in chosen)
    return worst / math.lcm(len(left), len(right)), worst


def evaluate(
    problem: PipelineProblem, mapping: Mapping, pairs: str = "used", budget: int | None = None
) -> PeriodReport:
    """Period, latency and memory of ``mapping`` by the model of docs/pipelines.md;
    ``budget`` (bytes), if given, bounds every device as well as its own memory."""
    mapping.check(problem)
    ivs = mapping.intervals
    compute, slowest = [], []
    memory, fits = {}, True
    for iv, need in zip(ivs, mapping_memory(problem, ivs), strict=True):
        w = problem.work(iv.first, iv.last)
        t = max(w / problem.platform.device(u).speed for u in iv.devices)
        compute.append(t / len(iv.devices))
        slowest.append(t)
        for u in iv.devices:
            memory[u] = need
            cap = capacity(problem, u, budget)
            fits = fits and (cap is None or need <= cap)
    links, hops = [], []
    for a, b in itertools.pairwise(ivs):
        period, one = boundary_period(problem, a.last, a.devices, b.devices, pairs)
        links.append(period)
        hops.append(one)
    period = max(compute + links)
    return PeriodReport(
        period, sum(slowest) + sum(hops), tuple(compute), tuple(links), memory, fits
    )


def compositions(length: int, parts: int | None = None) -> Iterator[tuple[int, ...]]:
    """Cut points (0, c1, ..., L) of every split of 0..L into consecutive intervals."""
    for n in range(1, length + 1) if parts is None else (parts,):
        for cuts in itertools.combinations(range(1, length), n - 1):
            yield (0, *cuts, length)


def all_mappings(problem: PipelineProblem, replicate: bool = True) -> Iterator[Mapping]:
    """Every interval mapping (device sets as sorted tuples); exponential, for tests."""
    names = [d.name for d in problem.platform.devices]
    P = len(names)
    for cuts in compositions(problem.length):
        n = len(cuts) - 1
        if n > P:
            continue
        # assign each device to one of the n intervals or to none (label n)
        for labels in itertools.product(range(n + 1), repeat=P):
            groups = [tuple(names[u] for u in range(P) if labels[u] == g) for g in range(n)]
            if any(not g for g in groups) or (not replicate and any(len(g) > 1 for g in groups)):
                continue
            yield Mapping(tuple(Interval(cuts[g], cuts[g + 1], groups[g]) for g in range(n)))


def exhaustive(
    problem: PipelineProblem, replicate: bool = True, pairs: str = "all", budget: int | None = None
) -> tuple[float, Mapping | None]:
    """Least period over every interval mapping that fits memory (brute force)."""
    best, arg = math.inf, None
    for m in all_mappings(problem, replicate):
        rep = evaluate(problem, m, pairs, budget)
        if rep.fits and rep.period < best - 1e-15:
            best, arg = rep.period, m
    return best, arg


def training_period(
    problem: PipelineProblem, mapping: Mapping, recompute: Sequence[float] | None = None
) -> float:
    """Steady-state seconds per micro-batch of 1F1B on a mapping without replication.

    Stage p (device u_p) takes c_p = (work + recompute_p) / speed per micro-batch;
    the forward link p -> p+1 carries a_j and the backward link carries d_j, each
    taking f_p and b_p. Stage p keeps P - p micro-batches in flight, so the forward of
    micro-batch n + P - p waits for the backward of n, which waits for the round trip
    below it. Every run of stages p..q forms a cycle (forward down, backward up) over
    q - p + 1 micro-batches, so the period is the largest cycle mean:

        max( max_p f_p, max_p b_p,
             max_{p <= q} [sum_{p <= r <= q} c_r + sum_{p <= r < q} (f_r + b_r)] / (q - p + 1) )

    (p == q gives c_p). Without communication this is max_p c_p (docs/pipelines.md).
    """
    ivs = mapping.intervals
    P = len(ivs)
    rec = list(recompute or [0.0] * P)
    devs = [iv.devices[0] for iv in ivs]
    c = [
        (problem.work(iv.first, iv.last) + rec[p]) / problem.platform.device(devs[p]).speed
        for p, iv in enumerate(ivs)
    ]
    x = problem.chain.in_size
    f = [link_time(problem, devs[p], devs[p + 1], x[ivs[p].last]) for p in range(P - 1)]
    b = [link_time(problem, devs[p + 1], devs[p], x[ivs[p].last]) for p in range(P - 1)]
    cycles = [
        (sum(c[p : q + 1]) + sum(f[p:q]) + sum(b[p:q])) / (q - p + 1)
        for p in range(P)
        for q in range(p, P)
    ]
    return max(f + b + cycles)
