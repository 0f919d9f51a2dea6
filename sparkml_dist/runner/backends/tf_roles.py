"""ParameterServerStrategy's roles inside a rank process: the chief, the servers.  [rank]

With ``BarrierRunner(np, backend="tensorflow", roles={"ps": p})`` (:mod:`sparkml_dist.runner.roles`)
each rank's ``TF_CONFIG`` names its role:

* the **chief** runs the function, whose ``tf.distribute.ParameterServerStrategy(resolver)``
  connects to the cluster: that call is the rank's rendezvous, and just before it the task's
  reserved port is closed for TensorFlow's server to bind it;
* a **worker** or **parameter server** runs no user code: :class:`Server` starts a
  ``tf.distribute.Server`` on its port (the rendezvous) and serves until its task writes the stop
  file (the driver's ``FRAME_STOP``, sent once the chief's function is done), then returns.

Example::

    state = join("ps", store_fd, reached)   # a Server: backend.role_main(state) is state.serve
    state.serve(workdir)                    # returns when the run is over
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional

from .. import protocol
from .base import close_fd, report_first_call

POLL_S = 0.1  # how often a server looks for its stop file


class Server:
    """A worker's or parameter server's rank: a ``tf.distribute.Server`` until the run ends."""

    def __init__(self, role: str, store_fd: Optional[int], reached: Callable[[], None]) -> None:
        self.role, self.store_fd, self.reached = role, store_fd, reached

    def serve(self, workdir: str) -> None:
        import tensorflow as tf

        task = json.loads(os.environ["TF_CONFIG"])["task"]
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        close_fd(self.store_fd)  # the port the peers were given: the server binds it now
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=task["type"],
            task_index=int(task["index"]),
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )
        self.reached()
        stop = os.path.join(workdir, protocol.STOP_FILE)
        while not os.path.exists(stop):
            time.sleep(POLL_S)
        del server  # the process exits next: its port closes with it


def join(role: str, store_fd: Optional[int], reached: Callable[[], None]) -> Optional[Server]:
    """The rank's state for its role: a :class:`Server`, or None for the chief (whose strategy's
    construction is hooked to close the port and report the rendezvous)."""
    if role != "chief":
        return Server(role, store_fd, reached)
    from tensorflow.python.distribute import parameter_server_strategy_v2 as ps

    closed = []

    def joining() -> None:
        if not closed:
            closed.append(True)
            close_fd(store_fd)
        reached()

    report_first_call([ps.ParameterServerStrategyV2], "__init__", joining)
    return None
