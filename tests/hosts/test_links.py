"""Links shaped like a cluster's Ethernet between the test hosts (tests/support/hosts.py): the rate
given is the rate a TCP stream gets, each way, and taking the shaping off gives the veth's speed
back.  A network of its own (no Spark), beside the pass's cluster.

Runs in the several-hosts pass (``make test-hosts``)."""

import pytest

from tests.support.hosts import Hosts, bits_per_s


def test_a_shaped_link_carries_its_rate_each_way_and_the_slower_end_decides(hosts):
    with Hosts(spark=False) as net:
        for h in ("host1", "host2"):
            net.shape(h, "1gbit")
        there, back = net.throughput("host1", "host2"), net.throughput("host2", "host1")
        for measured in (there, back):  # TCP's headers take ~5% of the line rate
            assert 0.8e9 <= measured <= 1.02e9, f"{measured / 1e9:.3f} Gbit/s on a 1 Gbit/s link"
        net.shape("host1", "200mbit")  # replaces host1's shaping; host2 stays at 1 Gbit/s
        slow = net.throughput("host2", "host1")
        assert 0.16e9 <= slow <= 0.204e9, f"{slow / 1e6:.0f} Mbit/s into a 200 Mbit/s host"
        assert any("tbf" in line and "200Mbit" in line for line in net.shaping("host1"))
        net.unshape("host1")
        net.unshape("host2")
        assert not any("tbf" in line for line in net.shaping("host1") + net.shaping("host2"))
        fast = net.throughput("host1", "host2")
        assert fast > 1.5e9, f"{fast / 1e9:.2f} Gbit/s after the shaping was taken off"
        try:
            net.shape("host1", "1gbit", delay="1ms")
        except RuntimeError as e:  # a kernel without netem (this machine's): said, not ignored
            assert "sch_netem" in str(e) and "delay=None" in str(e)
            assert not any("tbf" in line for line in net.shaping("host1"))
        else:
            assert any("netem" in line for line in net.shaping("host1"))
            assert 0.8e9 <= net.throughput("host1", "host2") <= 1.02e9
    assert net.leftovers() == []


def test_a_rate_is_read_in_tc_units_and_a_bad_one_is_refused_naming_it():
    assert bits_per_s("1gbit") == 1e9 and bits_per_s("10Gbit") == 1e10 and bits_per_s("200mbit") == 2e8
    for bad in ("fast", "0gbit", "gbit", "1gbps"):
        with pytest.raises(ValueError, match="rate .*e.g. '1gbit'"):
            bits_per_s(bad)
