"""Has this process joined the run's rendezvous store?  [rank process; Linux]

Every c10d path to distribution (``init_process_group``, ``init_device_mesh``,
``torch.distributed.rpc.init_rpc``, launchers built on them, a ``TCPStore`` made by hand) opens a
TCP connection to the store at ``MASTER_ADDR:MASTER_PORT``.  :func:`watch` polls this process's
own sockets (``/proc/self/fd`` against ``/proc/self/net/tcp{,6}``) for an established connection
to that port and calls ``on_join`` once, so reaching the rendezvous does not depend on which
function got there.  Where ``/proc`` is missing (not Linux), it returns False and the backend's
function hook is all there is.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Set

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


def connected_to(port: int) -> bool:
    """True when one of this process's TCP sockets is connected to ``port`` (as a client)."""
    inodes = _own_socket_inodes()
    if not inodes:
        return False
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
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and local_port != port:  # a client of the store, not its server side
                return True
    return False


def watch(port: int, on_join: Callable[[], None]) -> bool:
    """Call ``on_join()`` (once, from a daemon thread) when this process connects to ``port``.

    Returns False when this platform has no ``/proc`` to watch.
    """
    if not os.path.isdir("/proc/self/fd") or not os.path.exists("/proc/self/net/tcp"):
        return False

    def poll() -> None:
        started = time.monotonic()
        while True:
            time.sleep(POLL_S if time.monotonic() - started < FAST_S else SLOW_S)
            if connected_to(port):
                on_join()
                return

    threading.Thread(target=poll, name="sparkml_dist-store-watch", daemon=True).start()
    return True
