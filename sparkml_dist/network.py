"""This host's address as other ranks reach it, and the interface holding it.  [anywhere]

Every listener of a run (the driver's log server, rank 0's rendezvous store) binds the address its
clients are given, not every interface: ``SPARK_LOCAL_IP`` when set (Spark's own setting for the
address a host binds), else the address of the interface that routes to the peer named (the
driver, seen from an executor), else of the one that routes outwards.  A host with no default
route (a private cluster network) thus still advertises the address its peers share, not loopback.
"""

from __future__ import annotations

import os
import socket
from typing import Optional


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
