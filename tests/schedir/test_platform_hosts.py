"""``Platform.hosts``: devices named host/device, intra- and inter-host links, and the
simulator charging a message between hosts at the inter-host bandwidth."""

from __future__ import annotations

import pytest

import schedir
from schedir.errors import InvalidProblem
from schedir.pipeline.baselines import one_f_one_b
from schedir.pipeline.problem import PipelineProblem


def test_devices_are_named_host_by_host_and_links_know_their_kind():
    plat = schedir.Platform.hosts(3, 2, 50e9, 5e9, intra_latency=1e-6, inter_latency=1e-5,
                                  speed=2.0, memory=1 << 30)  # fmt: skip
    names = [d.name for d in plat.devices]
    assert names == ["h0/d0", "h0/d1", "h1/d0", "h1/d1", "h2/d0", "h2/d1"]
    assert len(plat.links) == 6 * 5
    for link in plat.links:
        inter = plat.host_of(link.src) != plat.host_of(link.dst)
        assert (link.bandwidth, link.latency) == ((5e9, 1e-5) if inter else (50e9, 1e-6))
    assert all(d.speed == 2.0 and d.memory == 1 << 30 for d in plat.devices)
    assert schedir.Platform.from_dict(plat.to_dict()) == plat
    assert schedir.Platform.host_of("gpu0") == "gpu0"


@pytest.mark.parametrize(
    ("args", "words"),
    [((0, 2, 1.0, 1.0), "n_hosts = 0"), ((2, True, 1.0, 1.0), "devices_per_host = True"),
     ((2, 2, 1.0, 0.0), "bandwidth = 0")],
)  # fmt: skip
def test_bad_host_counts_and_bandwidths_are_named(args, words):
    with pytest.raises(InvalidProblem, match=words):
        schedir.Platform.hosts(*args)


def test_the_simulator_charges_messages_between_hosts_at_the_network_bandwidth():
    L = 4
    chain = schedir.Chain.from_rotor([1.0] * L, [1.0] * (L + 1), [100] * (L + 1),
                                     [1] * (L + 1), [0] * L, [0] * (L + 1))  # fmt: skip
    plat = schedir.Platform.hosts(2, 2, 1000.0, 10.0)
    pb = PipelineProblem(chain, [0] * L, plat, 4, True)
    trace = schedir.simulate_pipeline(pb, one_f_one_b(pb))
    sends = {(r.resource[1], r.resource[2]): r.end - r.start for r in trace.records
             if r.resource[0] == "link"}  # fmt: skip
    assert sends[("h0/d0", "h0/d1")] == pytest.approx(100 / 1000.0)
    assert sends[("h0/d1", "h1/d0")] == pytest.approx(100 / 10.0)  # the host boundary
