"""The rank network lets no one in: bound listeners, pre-auth limits, no Spark secrets in ranks."""

import logging
import socket
import threading
import time

import pytest

from sparkml_dist import ConfigurationError, channel
from sparkml_dist.channel import LogClient, new_secret
from sparkml_dist.channel import server as channel_server
from sparkml_dist.channel.server import LogServer
from sparkml_dist.host import network
from sparkml_dist.runner import BarrierRunner, admission


def _wait(cond, within=10.0):
    deadline = time.time() + within
    while not cond() and time.time() < deadline:
        time.sleep(0.05)
    return cond()


def test_unauthenticated_connections_are_bounded_cost_no_thread_and_expire(monkeypatch):
    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT", 1.0)
    got, secret = [], new_secret()
    server = LogServer(secret, got.append, host="127.0.0.1")
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(channel_server.MAX_UNAUTHENTICATED + 10):  # connect, never answer the challenge
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
        assert _wait(lambda: server.rejected >= 10)  # the ones over the bound were closed on accept
        assert server.unauthenticated <= channel_server.MAX_UNAUTHENTICATED
        assert threading.active_count() <= threads_before  # one server thread, whatever connects
        assert _wait(lambda: server.unauthenticated == 0, within=5)  # the rest expire unanswered
        client = LogClient("127.0.0.1", server.port, secret)  # a rank still gets in afterwards
        client.send({"type": "line", "rank": 0, "text": "hello"})
        assert _wait(lambda: got == [{"type": "line", "rank": 0, "text": "hello"}])
        client.close()
    finally:
        for s in idle:
            s.close()
        server.close()


def test_log_server_listens_on_the_given_address_only(caplog):
    server = LogServer(new_secret(), lambda m: None, host="127.0.0.1")
    assert server.address == "127.0.0.1"
    server.close()
    with caplog.at_level(logging.WARNING):
        fallback = channel_server.listen(
            new_secret(), lambda m: None, "203.0.113.7"
        )  # not an address of ours
    assert fallback.address == "0.0.0.0" and "listening on every interface" in caplog.text
    fallback.close()


def _rank_view():
    """In a rank: the listening address of rank 0's store and the environment it sees."""
    import os

    import psutil

    port = int(os.environ["MASTER_PORT"])
    listening = sorted(
        {
            c.laddr.ip
            for c in psutil.Process().net_connections("tcp")
            if c.status == "LISTEN" and c.laddr.port == port
        }
    )
    keys = (
        "SPARK_AUTHENTICATE_SECRET",
        "_SPARK_AUTH_SECRET",
        "PYSPARK_GATEWAY_SECRET",
        "SPARK_CONNECT_AUTHENTICATE_TOKEN",
        "SPARKML_DIST_TEST_OWN_VAR",
        "MASTER_ADDR",
    )
    return {"store": listening, "env": {k: os.environ.get(k) for k in keys}}


def test_ranks_bind_the_advertised_address_and_inherit_no_spark_secret(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    for name in (
        "SPARK_AUTHENTICATE_SECRET",
        "_SPARK_AUTH_SECRET",
        "PYSPARK_GATEWAY_SECRET",
        "SPARK_CONNECT_AUTHENTICATE_TOKEN",
    ):
        monkeypatch.setenv(name, "s3cr3t")
    monkeypatch.setenv("SPARKML_DIST_TEST_OWN_VAR", "kept")
    view = BarrierRunner(-2, timeout=120).run(_rank_view)
    assert view["store"] == ["127.0.0.1"]  # rank 0's store: the address peers are given, nothing else
    assert view["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert view["env"]["SPARKML_DIST_TEST_OWN_VAR"] == "kept"
    assert all(
        view["env"][k] is None for k in view["env"] if k not in ("SPARKML_DIST_TEST_OWN_VAR", "MASTER_ADDR")
    )


def test_authenticated_cluster_is_refused_unless_opted_in():
    conf = lambda d: lambda k, default=None: d.get(k, default)  # noqa: E731
    assert admission.check_authentication(conf({}), False) is None
    with pytest.raises(ConfigurationError, match=r"spark.authenticate=true.*allow_unauthenticated=True"):
        admission.check_authentication(conf({"spark.authenticate": "true"}), False)
    assert "running anyway" in admission.check_authentication(conf({"spark.authenticate": "true"}), True)


def test_the_store_watch_matches_the_store_address_and_gives_up_after_start_timeout():
    from sparkml_dist.runner.backends import store_watch

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    try:
        assert store_watch.connected_to(port, store_watch.addresses("localhost"))
        assert store_watch.connected_to(port, {"127.0.0.1"})
        assert not store_watch.connected_to(port, {"10.1.2.3"})  # the same port on another host
        joined = []
        assert store_watch.watch("127.0.0.1", port, lambda: joined.append(1), within=5)
        assert _wait(lambda: joined == [1], within=5)
        other = []
        store_watch.watch("10.1.2.3", port, lambda: other.append(1), within=0.5)
        assert _wait(lambda: "sparkml_dist-store-watch" not in {t.name for t in threading.enumerate()}, 5)
        assert other == []
    finally:
        client.close()
        server.close()
    assert store_watch._address("0100007F") == "127.0.0.1"
    assert store_watch._address("0000000000000000FFFF00000100007F") == "127.0.0.1"


def test_a_port_a_framework_binds_again_is_outside_the_ephemeral_range_and_free_everywhere(monkeypatch):
    """TensorFlow's gRPC server binds [::]:port after the task closes its socket: the port must be
    one no bind(0)/connect of another process can take meanwhile, and held on no other address."""
    listener = network.reserve_port("127.0.0.1")
    port = listener.getsockname()[1]
    (low, high), _ = network._port_ranges()
    assert listener.getsockname()[0] == "127.0.0.1" and not low <= port <= high
    with pytest.raises(ConnectionRefusedError):  # held, not listening: an early peer is refused
        socket.create_connection(("127.0.0.1", port), timeout=5)
    listener.close()
    grpc_like = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)  # as TensorFlow binds it
    grpc_like.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    grpc_like.bind(("::", port))
    grpc_like.close()
    # a port held on another address of the host is skipped: the wildcard bind would fail on it
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.2", port))
    monkeypatch.setattr(network, "quiet_ports", lambda: range(port, port + 1))
    fallback = network.reserve_port("127.0.0.1", tries=8)
    assert fallback.getsockname()[1] != port  # after the tries, any free port: never the held one
    fallback.close()
    monkeypatch.setattr(network, "quiet_ports", lambda: range(port, port + 2))
    chosen = network.reserve_port("127.0.0.1", tries=64)
    assert chosen.getsockname()[1] == port + 1
    chosen.close()
    held.close()


def test_a_peer_waits_for_the_framework_server_to_listen_on_its_reserved_port():
    """A rank's framework connects to rank 0's server only once it accepts: a refused first
    connection would cost gRPC's reconnect backoff (a second)."""
    reservation = network.reserve_port("127.0.0.1")
    port = reservation.getsockname()[1]
    started = time.monotonic()
    assert not network.wait_listening("127.0.0.1", port, 0.3)  # reserved only: never accepts
    assert time.monotonic() - started >= 0.3

    def serve_later():
        time.sleep(0.3)
        reservation.close()  # as the rank does, then its framework binds the port and listens
        servers.append(socket.create_server(("127.0.0.1", port)))

    servers = []
    later = threading.Thread(target=serve_later)
    started = time.monotonic()
    later.start()
    assert network.wait_listening("127.0.0.1", port, 30)
    waited = time.monotonic() - started
    later.join()
    servers[0].close()
    assert waited >= 0.3  # true only once the framework's server listened (the effect: bench_frameworks)
