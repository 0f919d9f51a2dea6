"""Has this process joined the run's rendezvous store?  [rank]

Every c10d path to distribution (``init_process_group``, ``init_device_mesh``,
``torch.distributed.rpc.init_rpc``, launchers built on them, a ``TCPStore`` made by hand) opens a
TCP connection to the store at ``MASTER_ADDR:MASTER_PORT``.  :func:`watch` polls this process's
own sockets (``/proc/self/fd`` against ``/proc/self/net/tcp{,6}``) for an established connection
to that address *and* port (a connection to the same port number on another host is not the
store) and calls ``on_join`` once, so reaching the rendezvous does not depend on which function
got there.  It stops polling after ``within`` seconds (the run's ``start_timeout``: by then the
task has failed a rank that never joined).  Where ``/proc`` is missing (not Linux), it returns
False and the backend's function hook is all there is.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Optional, Set

ESTABLISHED = "01"
POLL_S = 0.1  # the first FAST_S seconds (a rank usually joins then), every SLOW_S after
FAST_S, SLOW_S = 10.0, 1.0


def _own_socket_inodes() -> Set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6} ("0100007F", or 32 hex digits) as text; an IPv4-mapped
    IPv6 address as its IPv4 form."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntoa(raw[::-1])
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntoa(raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


def addresses(host: str) -> Set[str]:
    """The addresses ``host`` (a name or an address) resolves to."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return {host}


def _established():
    """``(local port, remote address, remote port)`` of this process's established TCP sockets."""
    inodes = _own_socket_inodes()
    if not inodes:
        return []
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED or fields[9] not in inodes:
                continue
            remote, remote_port = fields[2].rsplit(":", 1)
            out.append((int(fields[1].rsplit(":", 1)[1], 16), remote, int(remote_port, 16)))
    return out


def connected_to(port: int, hosts: Optional[Set[str]] = None) -> bool:
    """True when one of this process's TCP sockets is connected to ``port`` (as a client) on one
    of ``hosts`` (any host when None)."""
    for local_port, remote, remote_port in _established():
        if remote_port != port or local_port == port:  # not a client of the store
            continue
        if hosts is None or _address(remote) in hosts:
            return True
    return False


def served(port: int) -> int:
    """How many connections this process serves on ``port`` (a store's clients), its own
    client's excepted."""
    rows = _established()
    own = {lp for lp, _, rp in rows if rp == port and lp != port}
    return sum(1 for lp, _, rp in rows if lp == port and rp not in own)


def wait_unserved(port: int, within: float) -> None:
    """Return once no other process is connected to this process's store on ``port`` (its peers
    have ended, or closed the store), or after ``within`` seconds."""
    start = time.monotonic()
    pause, end = 0.005, start + within
    while served(port) and time.monotonic() < end:
        time.sleep(pause)  # peers usually leave within milliseconds of rank 0: look often, then less
        pause = min(0.02 if time.monotonic() - start < FAST_S else POLL_S, pause * 2)


def watch(host: str, port: int, on_join: Callable[[], None], within: Optional[float] = None) -> bool:
    """Call ``on_join()`` (once, from a daemon thread) when this process connects to
    ``host:port``; stop watching after ``within`` seconds (None: until it does).

    Returns False when this platform has no ``/proc`` to watch.
    """
    if not os.path.isdir("/proc/self/fd") or not os.path.exists("/proc/self/net/tcp"):
        return False
    hosts = addresses(host)

    def poll() -> None:
        started = time.monotonic()
        while within is None or time.monotonic() - started < within:
            time.sleep(POLL_S if time.monotonic() - started < FAST_S else SLOW_S)
            if connected_to(port, hosts):
                on_join()
                return

    threading.Thread(target=poll, name="sparkml_dist-store-watch", daemon=True).start()
    return True
