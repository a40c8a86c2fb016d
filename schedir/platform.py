"""Platforms: memory spaces, copy engines, devices and links (docs/offload.md, docs/pipelines.md).

A :class:`Platform` describes where a schedule runs. Its offloading part is the
device's and the host's memory capacities and one copy engine per direction; its
multi-device part is a list of devices (speed factor, memory) and the links between
them. Problems pair a Platform with a Chain or Graph; the Platform never holds work.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace

from schedir.errors import InvalidProblem

# Times (s), speeds and bandwidths (bytes/s) and byte counts must lie within
# [1 / LIMIT, LIMIT] (or be 0 or inf where that has a meaning): then no sum, product or
# quotient the models form overflows to inf or NaN.
LIMIT = 1e100


def check_number(
    name: str,
    value: object,
    *,
    zero: bool = True,
    inf: bool = False,
    divisor: bool = False,
    what: str = "number",
) -> float:
    """``value`` as a float, or InvalidProblem naming ``name``: NaN, negative, 0 unless
    ``zero``, inf unless ``inf``, above LIMIT, and (for a ``divisor``) positive but
    below 1 / LIMIT are refused."""
    shown = _show(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidProblem(f"{name} = {shown}: expected a {what}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        v = math.inf
    if math.isnan(v) or v < 0:
        raise InvalidProblem(f"{name} = {shown}: expected a non-negative {what}")
    if v == 0 and not zero:
        raise InvalidProblem(f"{name} = {shown}: expected a positive {what}")
    if math.isinf(v) and inf and not isinstance(value, numbers.Integral):
        return v
    if v > LIMIT or (divisor and 0 < v < 1 / LIMIT):
        bounds = "[1e-100, 1e100]" if divisor else "[0, 1e100]"
        raise InvalidProblem(
            f"{name} = {shown}: outside {bounds}, where sums and quotients of times, "
            "rates and sizes would overflow"
        )
    return v


def check_bytes(name: str, value: object) -> int:
    """A byte count: a non-negative integer no larger than LIMIT (InvalidProblem else)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidProblem(f"{name} = {_show(value)}: expected a non-negative integer (bytes)")
    if value > LIMIT:
        check_number(name, value)  # the overflow message
    return int(value)


def _show(value: object) -> str:
    """repr of ``value``, shortened to one readable line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} chars)"


def _capacity(name: str, value: object) -> int | None:
    """Bytes, or None for unlimited; never rounded."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidProblem(f"{name} = {value!r}: expected a non-negative integer (bytes)")
    return int(value)


@dataclass(frozen=True)
class CopyEngine:
    """One copy direction: a transfer of n bytes takes ``latency + n / bandwidth`` seconds.

    Attributes:
        bandwidth: bytes/s (0: no copy possible; inf: free transfers).
        latency: seconds per transfer.
    """

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        bandwidth = check_number("bandwidth", self.bandwidth, inf=True, divisor=True)
        object.__setattr__(self, "bandwidth", bandwidth)
        object.__setattr__(self, "latency", check_number("latency", self.latency))

    def time(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` (inf when the bandwidth is 0 and nbytes > 0)."""
        return _transfer_time(self.bandwidth, self.latency, nbytes)


def _transfer_time(bandwidth: float, latency: float, nbytes: int) -> float:
    if nbytes == 0:
        return latency
    if bandwidth == 0:
        return math.inf
    return latency + nbytes / bandwidth


@dataclass(frozen=True)
class Device:
    """A compute device.

    Attributes:
        name: unique name.
        speed: relative speed; a task of time t (profiled) takes t / speed seconds.
        memory: capacity, bytes (None: unlimited).
    """

    name: str
    speed: float = 1.0
    memory: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidProblem(f"device name = {self.name!r}: expected a non-empty string")
        speed = check_number(f"device {self.name!r} speed", self.speed, zero=False, divisor=True)
        object.__setattr__(self, "speed", speed)
        object.__setattr__(self, "memory", _capacity(f"device {self.name!r} memory", self.memory))


@dataclass(frozen=True)
class Link:
    """A directed link between two devices (one port each way).

    Attributes:
        src, dst: device names.
        bandwidth: bytes/s.
        latency: seconds per message.
    """

    src: str
    dst: str
    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        for end in (self.src, self.dst):
            if not isinstance(end, str) or not end:
                raise InvalidProblem(f"link {self.src!r}->{self.dst!r}: device names are strings")
        label = f"link {self.src}->{self.dst}"
        # a link of bandwidth 0 carries nothing: a missing link says so
        bandwidth = check_number(
            f"{label} bandwidth", self.bandwidth, zero=False, inf=True, divisor=True
        )
        object.__setattr__(self, "bandwidth", bandwidth)
        latency = check_number(f"{label} latency", self.latency)
        object.__setattr__(self, "latency", latency)

    def time(self, nbytes: int) -> float:
        """Seconds to send ``nbytes`` (inf when the bandwidth is 0 and nbytes > 0)."""
        return _transfer_time(self.bandwidth, self.latency, nbytes)


# Copy bandwidths per direction, bytes/s, of common host links (order of magnitude).
PRESETS: dict[str, float] = {
    "pcie3": 12e9,
    "pcie4": 25e9,
    "pcie5": 50e9,
    "nvlink-c2c": 450e9,
}


@dataclass(frozen=True)
class Platform:
    """Where a schedule runs.

    Attributes:
        device_memory: bytes of the (single) device for offloading problems; None: unlimited.
        host_memory: bytes of host memory; None: unlimited.
        offload: device -> host copy engine.
        prefetch: host -> device copy engine.
        devices: compute devices for multi-device problems.
        links: directed links between devices (absent pairs cannot communicate).
    """

    device_memory: int | None = None
    host_memory: int | None = None
    offload: CopyEngine = field(default_factory=lambda: CopyEngine(0.0))
    prefetch: CopyEngine = field(default_factory=lambda: CopyEngine(0.0))
    devices: tuple[Device, ...] = ()
    links: tuple[Link, ...] = ()
    # name -> Device and (src, dst) -> Link, built once (not fields of the value)
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_memory", _capacity("device_memory", self.device_memory))
        object.__setattr__(self, "host_memory", _capacity("host_memory", self.host_memory))
        for name in ("offload", "prefetch"):
            if not isinstance(getattr(self, name), CopyEngine):
                raise InvalidProblem(f"{name} = {getattr(self, name)!r}: expected a CopyEngine")
        devices, links = tuple(self.devices), tuple(self.links)
        for k, d in enumerate(devices):
            if not isinstance(d, Device):
                raise InvalidProblem(f"devices[{k}] = {d!r}: expected a Device")
        for k, link in enumerate(links):
            if not isinstance(link, Link):
                raise InvalidProblem(f"links[{k}] = {link!r}: expected a Link")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise InvalidProblem(f"devices: duplicate names in {names}")
        seen = set()
        for link in links:
            for end in (link.src, link.dst):
                if end not in names:
                    raise InvalidProblem(f"link {link.src}->{link.dst}: unknown device {end!r}")
            if (link.src, link.dst) in seen:
                raise InvalidProblem(f"link {link.src}->{link.dst} is given twice")
            seen.add((link.src, link.dst))
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "links", links)
        index = {("device", d.name): d for d in devices}
        index.update({("link", lk.src, lk.dst): lk for lk in links})
        object.__setattr__(self, "_index", index)

    # Constructors.
    @classmethod
    def host_offload(
        cls,
        bandwidth: float | str,
        *,
        device_memory: int | None = None,
        host_memory: int | None = None,
        latency: float = 0.0,
    ) -> Platform:
        """One device and a host link of ``bandwidth`` bytes/s (or a PRESETS name) each way.

        >>> Platform.host_offload("pcie4").offload.bandwidth
        25000000000.0
        """
        if isinstance(bandwidth, str):
            if bandwidth not in PRESETS:
                known = ", ".join(PRESETS)
                raise InvalidProblem(f"bandwidth preset {bandwidth!r} unknown; known: {known}")
            bandwidth = PRESETS[bandwidth]
        engine = CopyEngine(bandwidth, latency)
        return cls(device_memory, host_memory, engine, engine)

    @classmethod
    def fully_connected(
        cls, devices: list[Device], bandwidth: float, latency: float = 0.0
    ) -> Platform:
        """Devices with a link of the same bandwidth between every ordered pair."""
        links = tuple(
            Link(a.name, b.name, bandwidth, latency) for a in devices for b in devices if a != b
        )
        return cls(devices=tuple(devices), links=links)

    @classmethod
    def star(cls, master: Device, workers: list[Device], bandwidths: list[float]) -> Platform:
        """A master linked both ways to each worker (one bandwidth per worker)."""
        if len(bandwidths) != len(workers):
            raise InvalidProblem(f"star: {len(bandwidths)} bandwidths for {len(workers)} workers")
        links = []
        for w, bw in zip(workers, bandwidths, strict=True):
            links += [Link(master.name, w.name, bw), Link(w.name, master.name, bw)]
        return cls(devices=(master, *workers), links=tuple(links))

    @classmethod
    def hosts(
        cls,
        n_hosts: int,
        devices_per_host: int,
        intra_bandwidth: float,
        inter_bandwidth: float,
        *,
        intra_latency: float = 0.0,
        inter_latency: float = 0.0,
        speed: float = 1.0,
        memory: int | None = None,
    ) -> Platform:
        """``n_hosts`` hosts of ``devices_per_host`` identical devices, every ordered pair
        linked: devices ``"h{host}/d{k}"``; a link between two devices of one host has
        ``intra_bandwidth`` bytes/s and ``intra_latency`` s (NVLink, or shared memory
        on CPU), between hosts ``inter_bandwidth`` and ``inter_latency`` (the network).
        Devices are listed host by host, in the order of ``jax.devices()`` under
        ``jax.distributed`` (process p holds devices p * K .. p * K + K - 1).

        >>> plat = Platform.hosts(2, 2, 100e9, 10e9, inter_latency=1e-5)
        >>> [d.name for d in plat.devices]
        ['h0/d0', 'h0/d1', 'h1/d0', 'h1/d1']
        >>> plat.link("h0/d1", "h1/d0").bandwidth, plat.host_of("h1/d0")
        (10000000000.0, 'h1')
        """
        for name, value in (("n_hosts", n_hosts), ("devices_per_host", devices_per_host)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise InvalidProblem(f"hosts: {name} = {value!r}: expected an integer >= 1")
        devices = [
            Device(f"h{h}/d{k}", speed, memory)
            for h in range(n_hosts)
            for k in range(devices_per_host)
        ]
        links = []
        for a in devices:
            for b in devices:
                if a is b:
                    continue
                same = cls.host_of(a.name) == cls.host_of(b.name)
                bw, lat = (
                    (intra_bandwidth, intra_latency) if same else (inter_bandwidth, inter_latency)
                )
                links.append(Link(a.name, b.name, bw, lat))
        return cls(devices=tuple(devices), links=tuple(links))

    @staticmethod
    def host_of(name: str) -> str:
        """The host part of a device name ``"host/device"`` (the whole name without a
        ``/``: a device on a host of its own)."""
        return name.split("/", 1)[0]

    def device(self, name: str) -> Device:
        found = self._index.get(("device", name))
        if found is None:
            known = [d.name for d in self.devices]
            raise InvalidProblem(f"unknown device {name!r}; known: {known}")
        return found

    def link(self, src: str, dst: str) -> Link:
        """The link src -> dst; InvalidProblem if there is none."""
        found = self._index.get(("link", src, dst))
        if found is None:
            raise InvalidProblem(f"no link {src}->{dst} on this platform")
        return found

    def find_link(self, src: str, dst: str) -> Link | None:
        """The link src -> dst, or None."""
        return self._index.get(("link", src, dst))

    def with_bandwidth(self, bandwidth: float) -> Platform:
        """The same platform with both copy engines at ``bandwidth`` bytes/s."""
        return replace(
            self,
            offload=CopyEngine(bandwidth, self.offload.latency),
            prefetch=CopyEngine(bandwidth, self.prefetch.latency),
        )

    # JSON.
    def to_dict(self) -> dict:
        return {
            "format": "schedir.platform",
            "version": 1,
            "device_memory": self.device_memory,
            "host_memory": self.host_memory,
            "offload": vars(self.offload),
            "prefetch": vars(self.prefetch),
            "devices": [vars(d) for d in self.devices],
            "links": [vars(link) for link in self.links],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Platform:
        if not isinstance(d, dict) or d.get("format") != "schedir.platform":
            raise InvalidProblem("expected a JSON object with format 'schedir.platform'")
        if d.get("version") != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        return cls(
            device_memory=d.get("device_memory"),
            host_memory=d.get("host_memory"),
            offload=_record(CopyEngine, "offload", d.get("offload", {"bandwidth": 0.0})),
            prefetch=_record(CopyEngine, "prefetch", d.get("prefetch", {"bandwidth": 0.0})),
            devices=tuple(_records(Device, "devices", d.get("devices", []))),
            links=tuple(_records(Link, "links", d.get("links", []))),
        )


def _record(cls: type, where: str, value: object):
    """``cls(**value)`` from a JSON object; InvalidProblem naming unknown or missing fields."""
    if not isinstance(value, dict):
        raise InvalidProblem(f"platform {where}: expected a JSON object, got {value!r}")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise InvalidProblem(f"platform {where}: unknown field(s) {unknown}; known: {known}")
    try:
        return cls(**value)
    except TypeError:  # a required field is missing
        raise InvalidProblem(f"platform {where}: missing a field; expected {known}") from None


def _records(cls: type, where: str, values: object) -> list:
    if not isinstance(values, list):
        raise InvalidProblem(f"platform {where}: expected a list, got {values!r}")
    return [_record(cls, f"{where}[{k}]", v) for k, v in enumerate(values)]
