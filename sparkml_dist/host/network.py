"""This host's address as other ranks reach it, and the interface holding it.  [anywhere]

Every listener of a run (the driver's log server, rank 0's rendezvous store) binds the address its
clients are given, not every interface: ``SPARK_LOCAL_IP`` when set (Spark's own setting for the
address a host binds), else the address of the interface that routes to the peer named (the
driver, seen from an executor), else of the one that routes outwards.  A host with no default
route (a private cluster network) thus still advertises the address its peers share, not loopback.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from typing import List, Optional, Tuple


def host_address(toward: Optional[str] = None) -> str:
    """An address of this host other ranks can reach: ``SPARK_LOCAL_IP`` when set, else the one
    this host uses to reach ``toward`` (the driver), else the one used to reach the outside
    (loopback when there is none).

    >>> host_address("127.0.0.1")
    '127.0.0.1'
    """
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    for peer in (toward, "10.255.255.255"):
        if not peer:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 1))  # no packet is sent for a UDP connect: a route lookup
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


def interface_of(address: str) -> Optional[str]:
    """The network interface holding ``address`` (Horovod's Gloo device binds it), if known."""
    try:
        import psutil  # a dependency of Horovod, so present wherever backend="horovod" runs
    except ImportError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


_RANDOM = random.SystemRandom()  # two tasks of one host never share a sequence of guesses


def _port_ranges() -> Tuple[Tuple[int, int], List[Tuple[int, int]]]:
    """(the kernel's ephemeral port range, the ranges it reserves for fixed services)."""
    low, high = 32768, 60999  # Linux's default, where /proc is not readable
    reserved: List[Tuple[int, int]] = []
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(v) for v in fh.read().split())
        with open("/proc/sys/net/ipv4/ip_local_reserved_ports") as fh:
            for part in filter(None, fh.read().strip().split(",")):
                a, _, b = part.partition("-")
                reserved.append((int(a), int(b or a)))
    except (OSError, ValueError):
        pass
    return (low, high), reserved


def quiet_ports() -> range:
    """Ports the kernel never hands out on its own: below its ephemeral range (from 10000, above
    most fixed services), else above it; empty when the range covers both."""
    (low, high), _ = _port_ranges()
    if low - 10000 >= 1000:
        return range(10000, low)
    return range(high + 1, 65536) if 65535 - high >= 1000 else range(0)


def _free_everywhere(port: int) -> bool:
    """No socket of this host holds ``port``, on any address and either IP version (the probe binds
    the dual-stack wildcard, as TensorFlow's gRPC server does: ``[::]:port``)."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host: the IPv4 wildcard decides
            continue
        try:
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            probe.bind((address, port))
            return True
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False  # else (IPv6 switched off): the IPv4 wildcard decides
        finally:
            probe.close()
    return False


def reserve_port(address: str, tries: int = 64) -> socket.socket:
    """A socket bound (not listening) on ``address`` at a port a framework can bind again once the
    socket is closed (TensorFlow's gRPC server binds ``[::]:port``; JAX's coordinator its address).
    Not listening: a peer that connects before the framework's server is up is refused at once
    (:func:`wait_listening`), not queued and then reset when the reservation closes.

    The port comes from :func:`quiet_ports` and is free on every address: between the close and
    the framework's bind, no ``bind(port=0)`` or outgoing connection of any process on the host can
    take it (the kernel picks those from its ephemeral range), and the framework's wildcard bind
    meets no socket on another address. After ``tries`` taken ports, any free port (``bind(0)``).

    >>> s = reserve_port("127.0.0.1"); s.getsockname()[1] in quiet_ports(); s.close()
    True
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    _, reserved = _port_ranges()
    ports = quiet_ports()
    for _ in range(tries if len(ports) else 0):
        port = _RANDOM.randrange(ports.start, ports.stop)
        if any(a <= port <= b for a, b in reserved) or not _free_everywhere(port):
            continue
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((address, port))
            return listener
        except OSError:
            listener.close()
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((address, 0))
    return listener


def wait_listening(host: str, port: int, within: float, every: float = 0.01) -> bool:
    """Until ``host:port`` accepts a TCP connection (closed at once), at most ``within`` seconds;
    whether it did.  A framework's client that meets a refused port waits out its reconnect backoff
    (gRPC's: a second) before trying again; a few connects of our own every ``every`` s do not.

    >>> with socket.create_server(("127.0.0.1", 0)) as s:
    ...     wait_listening("127.0.0.1", s.getsockname()[1], 1.0)
    True
    """
    end = time.monotonic() + within
    while True:
        try:
            socket.create_connection((host, port), timeout=max(every, 1.0)).close()
            return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(every)


def is_this_host(host: Optional[str]) -> bool:
    """True when ``host`` (a name or an address) is an address of this machine: one a socket can
    bind here (the driver's host, seen from a task on the same machine)."""
    if not host:
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return False
    for address in addresses:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((address, 0))
            return True
        except OSError:
            continue
    return False
