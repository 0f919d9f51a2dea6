"""Horovod inside a rank process: its import, and its Gloo rendezvous server.  [rank]

With ``backend="horovod"`` there is no ``horovodrun``, mpirun or ssh: the ranks are the runner's own
processes, and Horovod's Gloo controller finds its peers through a key-value HTTP server (the
protocol of ``horovod.runner.http``) given by ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``.  Rank 0's
process serves it, with Horovod's own request handler, on the socket its barrier task bound and
listens on before the ranks exchanged addresses, so the port is known without a race, and a peer
that connects before the server thread runs waits in the listen backlog.  The rest of the
environment (``HOROVOD_RANK``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_CROSS_RANK``, ...) comes from
:func:`sparkml_dist.runner.backends.horovod_env`.
"""

from __future__ import annotations

import socket
import threading
from typing import Sequence

from ...errors import ConfigurationError

INSTALL_HINT = (
    "Install it in the Python the executors run (PYSPARK_PYTHON) with `make horovod` or "
    "`scripts/install_horovod.sh /path/to/python` (Horovod 0.28.1 built with PyTorch and Gloo)."
)


def import_horovod_torch():
    """``horovod.torch``, or a ConfigurationError that says how to install it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise ConfigurationError(
            f"backend='horovod' needs horovod.torch, which cannot be imported here "
            f"({type(exc).__name__}: {exc}). {INSTALL_HINT}"
        ) from None
    return hvd


def serve_rendezvous(listen_fd: int, slots: Sequence[dict]):
    """Serve Horovod's Gloo rendezvous on the listening socket ``listen_fd``; returns the server.

    ``slots`` are the ranks' placements (:func:`sparkml_dist.runner.backends.horovod_slots`):
    Horovod's handler uses them to clear a scope once all of its ranks finished connecting.
    """
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class _Server(RendezvousHTTPServer):
        def server_bind(self) -> None:  # adopt the task's socket: already bound and listening
            self.socket.close()
            self.socket = socket.socket(fileno=listen_fd)
            self.server_address = self.socket.getsockname()
            self.server_name, self.server_port = self.server_address[:2]

        def server_activate(self) -> None:
            pass

    server = _Server(("0.0.0.0", 0), RendezvousHandler, False)
    server.init([SlotInfo(**s) for s in slots])
    threading.Thread(target=server.serve_forever, name="sparkml_dist-horovod-rendezvous", daemon=True).start()
    return server
