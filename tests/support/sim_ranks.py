"""Thousands of simulated ranks against the driver-side code that grows with the cluster.

What is real: the driver's log channel (:class:`sparkml_dist.channel.server.LogServer`) feeding the
runner's own :class:`sparkml_dist.runner.failures.Monitor` (the console the user reads), rank 0's
rendezvous store (torch's ``TCPStore`` served on a listening socket exactly as
``backends._host_store`` serves it), each rank's :class:`sparkml_dist.channel.LogClient` with a
task's settings (5 s timeout, 30 s of handshake retries), and :func:`sparkml_dist.collection.decode`.

What is simulated: the ranks.  Each is a thread in one of a few client processes (not an
interpreter per rank) that does, on the driver's and rank 0's side, what a barrier task does:
connects to the channel from its "host" (one of several loopback addresses, ``ranks_per_host``
ranks each, as tasks of one machine share an address), announces itself, joins the store's
rendezvous (adds itself to the arrival count, the last arrival sets the key every rank waits on,
then reads the id rank 0 published: NCCL's pattern), streams ``lines_per_s`` lines for
``seconds`` (only the ranks in ``log_ranks``), and says it is done.

One thing of this machine is set aside: torch's store client looks up its peer's name (a reverse
DNS query), and this machine's nameserver does not answer, so with more than ~20 clients
connecting at once each waits out the resolver's 5 s timeout (measured: 50 clients, median 5 s).
A cluster's DNS answers; so the simulated ranks and rank 0 run in a mount namespace of their own
whose ``/etc/resolv.conf`` names a loopback resolver that refuses at once (root only; elsewhere
the machine's resolver is used and its cost shows in ``store_s``).

Example::

    out = simulate(1000, lines_per_s=100, seconds=5, log_ranks="all")
    out["lost_lines"], out["rendezvous_s"], out["rss_growth_mib"]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import socket
import threading
import time
from datetime import timedelta
from typing import Dict, List


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _fast_resolver() -> bool:
    """This process's ``/etc/resolv.conf`` replaced, in a mount namespace of its own, by one naming a
    loopback resolver that refuses at once; False where that cannot be done (not root)."""
    import ctypes
    import tempfile

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_bind, ms_rec, ms_private = 0x00020000, 4096, 16384, 1 << 18
    if os.geteuid() != 0 or libc.unshare(clone_newns) != 0:
        return False
    if libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0:  # nothing leaks to the host
        return False
    conf = os.path.join(tempfile.mkdtemp(prefix="sim_ranks_"), "resolv.conf")
    with open(conf, "w") as fh:
        fh.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    return libc.mount(conf.encode(), b"/etc/resolv.conf", None, ms_bind, None) == 0


def _host_address(h: int) -> str:
    """Simulated host ``h``'s loopback address: 127.1.0.1 ... 127.1.0.250 (binding 127.1.1.x failed
    in the client processes here with "Name or service not known": 250 hosts at most)."""
    if h >= 250:
        raise ValueError(f"simulated host {h}: at most 250 (raise ranks_per_host)")
    return f"127.1.0.{1 + h}"


def _rank(r, world, channel, secret, store_at, plan, out, start) -> None:
    """One simulated rank's life, timed; what went wrong kept in ``out``."""
    import torch.distributed as dist

    from sparkml_dist.channel import LogClient
    from sparkml_dist.runner import protocol

    lines_per_s, seconds, streams, per_host = plan
    rec: Dict[str, object] = {"rank": r}
    try:
        start.wait()
        t0 = time.monotonic()
        client = LogClient(
            *channel, secret, timeout=5.0, retry_for=30.0, source=f"127.0.1.{1 + r // per_host}"
        )
        rec["connected_s"] = time.monotonic() - t0
        client.send({"type": protocol.FRAME_RENDEZVOUS, "rank": r, "host": f"127.0.1.{1 + r // per_host}"})
        store = dist.TCPStore(*store_at, world, is_master=False, timeout=timedelta(seconds=120))
        rec["store_s"] = time.monotonic() - t0
        if store.add("sim/arrived", 1) == world:
            store.set("sim/go", "1")
        store.wait(["sim/go"])
        rec["unique_id"] = store.get("sim/unique_id").decode()
        rec["rendezvous_s"] = time.monotonic() - t0
        sent = 0
        if streams:
            t1, total = time.monotonic(), int(lines_per_s * seconds)
            for i in range(total):
                client.send(
                    {
                        "type": protocol.FRAME_LINE,
                        "rank": r,
                        "stream": "stdout",
                        "text": f"step {i} loss 0.{r}",
                    }
                )
                sent += 1
                ahead = t1 + (i + 1) / lines_per_s - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        rec["sent"] = sent
        rec["still_connected"] = client.connected
        client.send({"type": protocol.FRAME_DONE, "rank": r})
        client.close()
        del store
    except Exception as exc:  # what a rank would report: kept, counted by the driver side
        import traceback

        rec["error"] = f"{type(exc).__name__}: {exc} at {traceback.format_exc(limit=-3)}"
    out.append(rec)


def _client_process(ranks, world, channel, secret, store_at, plan, conn) -> None:
    """A process of simulated ranks: one thread each, all released together."""
    _fast_resolver()
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    threading.stack_size(256 * 1024)
    out: List[dict] = []
    start = threading.Event()
    threads = [
        threading.Thread(target=_rank, args=(r, world, channel, secret, store_at, plan[r], out, start))
        for r in ranks
    ]
    for t in threads:
        t.start()
    conn.send("ready")
    conn.recv()  # go
    start.set()
    for t in threads:
        t.join()
    conn.send(out)
    conn.close()


def _recv(conn, proc, timeout: float):
    """What ``proc`` sends on ``conn`` within ``timeout`` seconds; an error naming it if it died."""
    deadline = time.monotonic() + timeout
    while not conn.poll(0.2):
        if not proc.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"simulation process {proc.name} ended or hung (exit code {proc.exitcode})")
    return conn.recv()


def _store_process(world: int, conn) -> None:
    """Rank 0's process: torch's TCPStore served on the socket its task bound, as
    ``backends._host_store`` serves it, holding the id every rank reads; until told to stop."""
    os.environ.setdefault("SPARKML_DIST_COLLECTIVE_TIMEOUT", "120")
    _fast_resolver()
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    from sparkml_dist.runner import backends

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    store = backends._host_store(world, listener.detach())  # the store owns the socket now
    store.set("sim/unique_id", "nccl-unique-id")
    conn.send(port)
    conn.recv()
    del store


def simulate(
    world: int,
    *,
    lines_per_s: float = 100.0,
    seconds: float = 5.0,
    log_ranks="0",
    procs: int = 4,
    ranks_per_host: int = 0,
) -> dict:
    """Run ``world`` simulated ranks against the driver's real channel, console and rank 0's store.

    Returns the driver's view: ``connected_s`` / ``rendezvous_s`` (the slowest rank's seconds from
    the start to its channel handshake / past the store's rendezvous), ``lines_sent`` and
    ``lines_shown`` (lines the console printed), ``lost_lines``, ``lines_per_s`` (shown, over the
    time from the first line shown to the last, at least ``seconds``), ``errors`` (rank errors,
    first few), ``rss_growth_mib`` and ``cpu_s`` of this (the driver's) process, ``rejected``
    (connections the server dropped), ``dropped`` (lines it had no room for, counted).
    ``ranks_per_host``: default 8 (16 from 2,001 ranks)."""
    from sparkml_dist.channel import new_secret
    from sparkml_dist.channel.server import listen
    from sparkml_dist.runner import failures

    os.environ.setdefault("SPARKML_DIST_COLLECTIVE_TIMEOUT", "120")
    ranks_per_host = ranks_per_host or max(8, -(-world // 250))  # 8, or 16 for 4,000 ranks
    streams = set(range(world)) if log_ranks == "all" else {int(x) for x in str(log_ranks).split(",")}
    shown, arrivals = [0], []

    def sink(text: str) -> None:
        shown[0] += text.count("\n")
        if len(arrivals) < 2:
            arrivals.append(time.monotonic())
        else:
            arrivals[1] = time.monotonic()

    rss0, cpu0 = _rss_mib(), time.process_time()
    monitor = failures.Monitor(world, sink)
    secret = new_secret()
    server = listen(secret, monitor.on_message, "127.0.0.1", expected=world)  # as run.py does
    ctx = mp.get_context("spawn")
    rank0, rank0_there = ctx.Pipe()
    store_proc = ctx.Process(target=_store_process, args=(world, rank0_there))
    store_proc.start()
    store_at = ("127.0.0.1", _recv(rank0, store_proc, 60))
    parts = [list(range(world))[i::procs] for i in range(procs)]
    plans = {r: (lines_per_s, seconds, r in streams, ranks_per_host) for r in range(world)}
    pipes, workers = [], []
    try:
        for part in parts:
            here, there = ctx.Pipe()
            mine = {r: plans[r] for r in part}
            args = (part, world, ("127.0.0.1", server.port), secret, store_at, mine, there)
            w = ctx.Process(target=_client_process, args=args)
            w.start()
            pipes.append(here)
            workers.append(w)
        for p, w in zip(pipes, workers):
            assert _recv(p, w, 120) == "ready"
        t0 = time.monotonic()
        for p in pipes:
            p.send("go")
        records = [rec for p, w in zip(pipes, workers) for rec in _recv(p, w, 600)]
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while len(monitor.finished) < world and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler thread drains what the selector queued
        time.sleep(0.5)
    finally:
        for w in workers:
            w.join(60)
            if w.is_alive():
                w.kill()
        server.close()
        if store_proc.is_alive():
            rank0.send("stop")
            store_proc.join(30)
    sent = sum(rec.get("sent", 0) for rec in records)
    errors = [rec["error"] for rec in records if "error" in rec]
    ok = [rec for rec in records if "error" not in rec]
    return {
        "world": world,
        "wall_s": wall,
        "connected_s": max((rec["connected_s"] for rec in ok), default=float("nan")),
        "store_s": max((rec["store_s"] for rec in ok), default=float("nan")),
        "rendezvous_s": max((rec["rendezvous_s"] for rec in ok), default=float("nan")),
        "unique_ids": {rec.get("unique_id") for rec in ok},
        "reached": len(monitor.reached),
        "finished": len(monitor.finished),
        "lines_sent": sent,
        "lines_shown": shown[0],
        "lost_lines": sent - shown[0],
        "lines_per_s": shown[0] / max(arrivals[1] - arrivals[0], seconds) if len(arrivals) == 2 else 0.0,
        "errors": len(errors),
        "first_errors": errors[:3],
        "rejected": server.rejected,
        "dropped": server.dropped,
        "rss_growth_mib": _rss_mib() - rss0,
        "cpu_s": time.process_time() - cpu0,
    }
