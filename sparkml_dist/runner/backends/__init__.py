"""The distributed backends a rank can run: torch.distributed, Horovod, TensorFlow, JAX.  [anywhere]

The backends' room: the registry and torch.distributed and Horovod here; TensorFlow's and JAX's
own contracts in :mod:`.frameworks`; Horovod inside a rank in :mod:`.horovod_rank`; what a
function imports, checked against its backend on the driver, in :mod:`.needs`. A
:class:`~.base.Backend` says everything that differs between them (the ``comm=`` settings and
compressions it takes, the environment it sets and reserves, its extra, what it refuses), and
nothing outside this room tests a backend's name (``tests/unit/test_layout.py`` holds it):

* driver: :meth:`~Backend.check_installed`, :attr:`~Backend.start_call` (named in errors) and
  :attr:`~Backend.peer_lost` (output that only says another rank went away);
* barrier task: :meth:`~Backend.rank_env`, the rendezvous environment and the GPUs a rank sees,
  and :attr:`~Backend.every_rank_listens` (each rank's task binds a port, not only rank 0's);
* rank process: :meth:`~Backend.prepare` (imports, and rank 0's rendezvous store, before the start
  message) and :meth:`~Backend.join` (after it: serve what needs the placements, and watch for
  what counts as reaching the rendezvous: a connection to the store for torch, ``hvd.init()``
  for Horovod), after :attr:`~Backend.env_defaults` (``KERAS_BACKEND``, ...) unless already set.

Example::

    backend = backends.get("horovod")
    env, extra = backend.rank_env(rank, peers, gpus, collective_timeout=600)
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

from ... import arg_checks
from ...errors import ConfigurationError
from ...gpus import gpu_env
from ...host import network
from .. import comm_settings, protocol, rendezvous
from . import reducers
from .base import COMMON_PEER_LOST, Backend, collective_timeout, report_first_call
from .frameworks import JaxBackend, TensorFlowBackend, refuse_multi_worker_strategy

__all__ = ["Backend", "BACKENDS", "collective_timeout", "get", "horovod_env", "horovod_slots"]


class TorchBackend(Backend):
    """torch.distributed (gloo, NCCL): rank 0's process hosts the TCPStore on the task's socket."""

    name = "torch"
    start_call = "init_process_group"
    extra = "torch"
    comm_names = (
        "bucket_cap_mb",
        "accumulate",
        "compression",
        "powersgd_rank",
        "powersgd_start",
        "static_graph",
        "reduction_servers",
    )
    compressions = comm_settings.COMPRESSIONS
    torch_group = True
    summary = "a torchrun-style script"
    env_defaults = {"KERAS_BACKEND": "torch"}  # Keras 3 programs (sparkml_dist.keras) run on torch

    def rank_env(self, rank, peers, gpus, collective_timeout, nodes="host", ranks_per_task=1, roles=None):
        workers = peers if roles is None else peers[: roles.workers]  # the torch world
        keys = rendezvous.node_keys([p["host"] for p in workers], nodes, ranks_per_task)
        if rank >= len(workers):  # a reduction server (backends.reducers): the store, its place
            return reducers.server_env(rank, len(workers), peers[0]["host"], peers[0]["port"]), {}
        all_gpus = [p["gpus"] for p in workers]
        return rendezvous.rank_env(rank, keys, peers[0]["host"], peers[0]["port"], all_gpus), {}

    warm_ranks = True

    def preload(self):
        import torch.distributed  # noqa: F401 - what prepare() imports; torch starts no runtime here

    # torch._dynamo (what a rank's first optimizer imports: 1.0-1.5 s) is not preloaded: a pool
    # that had imported it made an unchanged DDP script's rank hang at its end 1 time in 3
    # (ProcessGroupGloo's destructor, tests/spark/test_cli_run.py), cause not found yet; a spare
    # rank imports it itself while it waits, and so does a spare executor's pool's standby
    # (tasks/standby.py): nothing is forked from either

    def spare_preload(self):
        try:
            import torch._dynamo  # noqa: F401 - what the replaced function's optimizer imports first
        except ImportError:  # pragma: no cover - a torch without it: the function imports what it has
            pass

    def prepare(self, rank, world, store_fd):
        import torch.distributed  # noqa: F401 - every rank imports torch while rank 0 starts the store

        return (
            _host_store(world, store_fd) if rank == 0 and store_fd is not None else None
        )  # else the driver's

    def join(self, state, rank, message, store_fd, reached):
        import torch.distributed as dist

        from . import store_watch

        # joining the store is reaching the rendezvous, whichever c10d path connects to it
        # (init_process_group, init_device_mesh, rpc.init_rpc, a launcher); the hook is the
        # fallback where /proc cannot be watched
        within = float(os.environ.get(protocol.START_TIMEOUT_ENV) or 0) or None
        store_watch.watch(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), reached, within)
        report_first_call([dist], "init_process_group", reached)
        refuse_multi_worker_strategy(self.name)
        if os.environ.get(protocol.ROLE_ENV) == reducers.ROLE:
            return reducers.Server(reached)
        return state

    def role_main(self, state):
        return getattr(state, "serve", None)  # a reduction server (backends.reducers)

    def finish(self, state):
        """Rank 0 serves the store: it stays until its peers are done with it (a peer still in
        ``init_process_group`` when rank 0's function returned would lose it), as torchrun's
        agent outlives its workers; at most the collective timeout."""
        from . import store_watch

        if state is not None and not isinstance(state, reducers.Server):
            store_watch.wait_unserved(int(os.environ["MASTER_PORT"]), collective_timeout().total_seconds())


def _host_store(world_size: int, fd: int):
    """The rendezvous store, served on the socket the task bound and listens on (fd)."""
    import socket

    import torch.distributed as dist

    with socket.socket(fileno=os.dup(fd)) as s:
        host, port = s.getsockname()[:2]  # the address the task bound: the one peers are given
    return dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=collective_timeout(),
        master_listen_fd=fd,
    )


class HorovodBackend(Backend):
    """Horovod over Gloo: rank 0's process serves Horovod's HTTP rendezvous; no mpirun, no ssh."""

    name = "horovod"
    start_call = "hvd.init()"
    extra = "horovod"
    comm_names = ("bucket_cap_mb", "accumulate", "compression", "cycle_time_ms", "hierarchical")
    compressions = (None, "fp16")
    summary = "a horovodrun-style script"
    reserved_env = (
        "HOROVOD_HOSTNAME",
        *protocol.HOROVOD_RANK_VARS,
        "HOROVOD_CONTROLLER",
        "HOROVOD_CPU_OPERATIONS",
        "HOROVOD_GLOO_TIMEOUT_SECONDS",
        "HOROVOD_GLOO_IFACE",
    )  # fmt: skip  (horovod_env: the Gloo rendezvous and its timeout, the collective_timeout's)
    peer_lost = COMMON_PEER_LOST + ("Horovod has been shut down",)

    def comm_env(self, settings):
        return comm_settings.horovod_env(settings)  # read when hvd.init() starts Horovod

    def check_installed(self) -> None:
        import importlib.util
        import sys

        if importlib.util.find_spec("horovod") is None:
            from .horovod_rank import INSTALL_HINT

            raise ConfigurationError(
                f"backend='horovod' needs Horovod, which is not installed in this "
                f"Python ({sys.executable}). {INSTALL_HINT}"
            )

    def rank_env(self, rank, peers, gpus, collective_timeout, nodes="host", ranks_per_task=1):
        hosts = [p["host"] for p in peers]  # Horovod's local ranks are a machine's, whatever nodes says
        me = peers[rank]["host"]
        env = horovod_env(
            rank, hosts, peers[0]["host"], peers[0]["port"], network.interface_of(me), collective_timeout
        )
        env.update(gpu_env(rank, hosts, [p["gpus"] for p in peers]))
        return env, ({"slots": horovod_slots(hosts)} if rank == 0 else {})

    def prepare(self, rank, world, store_fd):
        from . import horovod_rank as _horovod

        return _horovod.import_horovod_torch()  # imported while the task writes the shard

    def join(self, state, rank, message, store_fd, reached):
        from . import horovod_rank as _horovod

        hvd, server = state, None
        if rank == 0:  # served before any rank can call hvd.init(): peers wait in the backlog
            server = _horovod.serve_rendezvous(store_fd, message["slots"])
        report_first_call([hvd.mpi_ops, hvd], "init", reached)
        refuse_multi_worker_strategy(self.name)
        return hvd, server

    def finish(self, state):
        """Every rank leaves together (a barrier): rank 0 leaving while a peer still connects a
        Gloo pair to it aborted that peer (seen under load)."""
        hvd = state[0]
        if hvd.is_initialized():
            hvd.barrier()


def horovod_slots(hosts: Sequence[str]) -> List[Dict[str, object]]:
    """Each rank's Horovod placement (the fields of ``horovod.runner.common.util.hosts.SlotInfo``).

    local rank: order among the ranks on its host; cross rank: order of its host among the hosts
    that have a rank of that local rank (hosts in order of their first rank), as ``horovodrun``
    assigns them.
    """
    locals_ = rendezvous.local_ranks(hosts)
    first_seen = list(dict.fromkeys(hosts))
    slots = []
    for rank, (host, (local_rank, local_size)) in enumerate(zip(hosts, locals_)):
        peers = [h for h in first_seen if sum(1 for x in hosts if x == h) > local_rank]
        slots.append(
            {
                "hostname": host,
                "rank": rank,
                "local_rank": local_rank,
                "cross_rank": peers.index(host),
                "size": len(hosts),
                "local_size": local_size,
                "cross_size": len(peers),
            }
        )
    return slots


def horovod_env(
    rank: int,
    hosts: Sequence[str],
    server_addr: str,
    server_port: int,
    iface: Optional[str],
    timeout_s: float,
) -> Dict[str, str]:
    """The environment ``hvd.init()`` reads to join a Gloo job whose rendezvous server is given.

    ``iface``: the network interface this rank's Gloo device binds (the one holding the address
    it advertised); None leaves Gloo to resolve the host name. RANK/WORLD_SIZE/LOCAL_RANK are set
    too, for :func:`sparkml_dist.runner.shard` and code that reads them.
    """
    slot = horovod_slots(hosts)[rank]
    env = {
        "HOROVOD_HOSTNAME": str(slot["hostname"]),
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(slot["size"]),
        "HOROVOD_LOCAL_RANK": str(slot["local_rank"]),
        "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
        "HOROVOD_CROSS_RANK": str(slot["cross_rank"]),
        "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": server_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, int(round(timeout_s)))),
        "RANK": str(rank),
        "WORLD_SIZE": str(slot["size"]),
        "LOCAL_RANK": str(slot["local_rank"]),
        "LOCAL_WORLD_SIZE": str(slot["local_size"]),
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


BACKENDS: Dict[str, Backend] = {
    b.name: b for b in (TorchBackend(), HorovodBackend(), TensorFlowBackend(), JaxBackend())
}


def reserved_env() -> Dict[str, str]:
    """Every variable a backend sets for its ranks itself -> which backend (refused in ``env=``
    whatever the run's backend: set by hand it would misplace a rank)."""
    return {name: f"the {b.name} backend" for b in BACKENDS.values() for name in b.reserved_env}


def get(name: str) -> Backend:
    """The backend called ``name``; a ConfigurationError listing the choices otherwise."""
    return BACKENDS[arg_checks.one_of("backend", name, tuple(BACKENDS))]
