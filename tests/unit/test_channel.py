"""The log channel keeps working whatever its peers do: a handler that raises, a flood
of idle unauthenticated connections, a server that stops reading, many bad peers."""

import logging
import socket
import threading
import time

import pytest

from sparkml_dist import WorkerError, channel
from sparkml_dist.channel import LogClient, inbox, new_secret
from sparkml_dist.channel import server as channel_server
from sparkml_dist.channel.server import LogServer
from sparkml_dist.runner import BarrierRunner
from tests.support.flood import Flood
from tests.support.flood import wait as _wait
from tests.support.runner_checks import assert_no_rank_left

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


def test_a_handler_that_raises_is_logged_and_the_channel_goes_on(caplog):
    got, secret = [], new_secret()

    def handler(message):
        if message.get("n") == 1:
            raise RuntimeError("a bug in a handler")
        got.append(message["n"])

    server = LogServer(secret, handler, host="127.0.0.1")
    try:
        client = LogClient("127.0.0.1", server.port, secret)
        with caplog.at_level(logging.ERROR):
            for n in range(4):
                client.send({"n": n})
            assert _wait(lambda: got == [0, 2, 3])
        assert server.handler_errors == 1 and "a bug in a handler" in caplog.text
        late = LogClient("127.0.0.1", server.port, secret)  # new connections are still served
        late.send({"n": 9})
        assert _wait(lambda: got[-1] == 9)
    finally:
        server.close()


def test_a_slow_handler_does_not_stall_the_selector():
    secret, release, got = new_secret(), threading.Event(), []
    server = LogServer(secret, lambda m: release.wait(10) if m["n"] == 0 else got.append(m["n"]), "127.0.0.1")
    try:
        first = LogClient("127.0.0.1", server.port, secret)
        first.send({"n": 0})  # the handler blocks on this one (an MLflow server that hangs)
        start = time.monotonic()
        second = LogClient("127.0.0.1", server.port, secret)  # the handshake is the selector's work
        assert time.monotonic() - start < 2
        second.send({"n": 1})
        release.set()
        assert _wait(lambda: got == [1])
    finally:
        release.set()
        server.close()


def test_a_flood_of_500_idle_connections_does_not_lock_clients_out():
    secret, got = new_secret(), []
    server = LogServer(secret, lambda m, send: (got.append(m["n"]), send({"ack": m["n"]})), "127.0.0.1", True)
    acks = []
    try:
        with Flood(server.port, 500):
            start = time.monotonic()
            for n in range(10):  # ten ranks arrive during the flood
                client = LogClient("127.0.0.1", server.port, secret, on_frame=acks.append, retry_for=20)
                client.send({"n": n})
            assert _wait(lambda: len(acks) == 10, within=20), (got, acks)
            assert time.monotonic() - start < 20
            assert server.unauthenticated <= channel_server.MAX_UNAUTHENTICATED
        assert sorted(got) == list(range(10))
    finally:
        server.close()


def test_a_send_to_a_server_that_stopped_reading_gives_up_and_drops_the_connection(monkeypatch):
    monkeypatch.setattr(channel, "SEND_TIMEOUT", 1.0)
    secret = new_secret()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def stuck_server():  # authenticates, then never reads again
        import hmac
        from hashlib import sha256

        conn, _ = listener.accept()
        nonce = b"n" * 32
        conn.sendall(nonce)
        assert conn.recv(32) == hmac.new(secret, nonce, sha256).digest()
        conn.sendall(channel.ACK)
        time.sleep(30)

    threading.Thread(target=stuck_server, daemon=True).start()
    client = LogClient("127.0.0.1", port, secret)
    start = time.monotonic()
    while client.connected and time.monotonic() - start < 30:
        client.send({"text": "x" * 60000})  # fills the socket buffers, then blocks
    assert not client.connected and time.monotonic() - start < 15
    client.send({"text": "after"})  # returns at once: nothing to send to
    listener.close()


def test_dropped_connections_are_warned_about_at_most_once_per_interval(caplog):
    server = LogServer(new_secret(), lambda m: None, "127.0.0.1")
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(30):
                s = socket.create_connection(("127.0.0.1", server.port))
                s.recv(32)
                s.sendall(b"x" * 32)  # a wrong answer to the challenge
                s.close()
            assert _wait(lambda: server.rejected >= 30)
        warnings = [r for r in caplog.records if "log channel: dropped" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
    finally:
        server.close()


def _run_flooded_and_faulty(monkeypatch, fn, *args):
    """Run ``fn`` with 2 local ranks while 500 idle connections flood the run's log server and its
    handler raises on every third output line."""
    real_listen, floods = channel_server.listen, []

    def listen(secret, on_message, host, replies=False, expected=0):
        count = [0]

        def faulty(message, *rest):  # raises on every third output line (not on other frames)
            count[0] += message.get("type") == "line"
            if message.get("type") == "line" and count[0] % 3 == 0:
                raise RuntimeError("a faulty handler")
            return on_message(message, *rest)

        server = real_listen(secret, faulty, host, replies, expected)
        flood = Flood(server.port, 500, server.address)
        flood.__enter__()
        floods.append(flood)
        return server

    from sparkml_dist.runner import run as run_module

    monkeypatch.setattr(run_module, "listen", listen)
    lines = []
    try:
        runner = BarrierRunner(-2, log_ranks="all", log_sink=lines.append, timeout=120)
        return runner.run(fn, *args), lines
    finally:
        for flood in floods:
            flood.__exit__()


def test_a_run_under_a_flood_and_a_faulty_handler_keeps_its_logs_and_failure_report(monkeypatch):
    from tests.support import runner_helpers as h

    start = time.monotonic()
    result, lines = _run_flooded_and_faulty(monkeypatch, h.print_lines, 30)
    assert result == "done"
    streamed = [t for t in lines if "] line " in t]
    assert len(streamed) >= 36 and {t.split("]")[0] for t in streamed} == {"[rank 0", "[rank 1"}  # 2/3 of 60
    with pytest.raises(WorkerError) as info:
        _run_flooded_and_faulty(monkeypatch, h.fail_on, 1, "raise", 0)
    assert "rank 1" in str(info.value) and "injected failure" in str(info.value)
    assert time.monotonic() - start < 120
    assert_no_rank_left()


def test_a_flooding_rank_is_shed_in_bounded_memory_while_the_others_lines_flow():
    """Rank 1 prints 16 KiB lines at full speed for 4 s while the driver shows a line a
    millisecond; rank 0 prints 16 short ones. Before the channel kept every line (512 MiB of driver
    memory), showed 3 of rank 0's 16 by the run's end and printed 1,389 lines after it returned."""
    import psutil

    from tests.support import runner_helpers as h

    shown, peak = [], [0]
    me = psutil.Process()
    start_rss = me.memory_info().rss

    def sink(text):
        shown.append(text)
        peak[0] = max(peak[0], me.memory_info().rss - start_rss)
        time.sleep(0.001)

    printed = BarrierRunner(-2, timeout=120, log_ranks="all", log_sink=sink).run(
        h.flood_or_talk, return_all=True
    )
    at_return = len(shown)
    time.sleep(1.5)
    assert len(shown) == at_return  # nothing is shown once run() has returned
    talk = [t for t in shown if "rank 0 says" in t]
    assert len(talk) == 16 and printed[0] == 16  # every line of the quiet rank, before the end
    flood = sum(1 for t in shown if "xxxx" in t)
    notice = next(t for t in shown if "lines from the ranks were not shown" in t)
    dropped = int(notice.split("(rank 1: ")[1].split(")")[0].replace(",", ""))
    assert flood + dropped == printed[1] and dropped > 0  # every line shown or counted, by rank
    assert "rank 0:" not in notice and "executor log" in notice
    assert peak[0] < 200 * 2**20, peak  # the inbox holds at most 16 MiB of lines


def test_lines_beyond_what_the_handler_takes_are_shed_and_counted_and_reports_wait(monkeypatch):
    monkeypatch.setattr(inbox, "MAX_QUEUED", 10)
    secret, got, release = new_secret(), [], threading.Event()

    def slow(message):
        release.wait(30)
        got.append(message)

    server = LogServer(secret, slow, "127.0.0.1")
    try:
        client = LogClient("127.0.0.1", server.port, secret)
        for n in range(50):
            client.send({"type": "line", "n": n})
        assert _wait(lambda: server.dropped > 0)
        client.send({"type": "done", "rank": 0})  # a report: waits for room, never shed
        time.sleep(0.5)
        release.set()
        assert _wait(lambda: any(m["type"] == "done" for m in got))
        lines = [m for m in got if m["type"] == "line"]
        assert len(lines) + server.dropped == 50 and server.dropped >= 30  # every line shown or counted
        assert client.connected and server.rejected == 0  # the connection stays
    finally:
        release.set()
        server.close()
