"""Who is in the run now: the generations of a torch.distributed group that loses ranks.  [rank]

Every rank of a run in :func:`sparkml_dist.runner.elastic.run` holds one :class:`Membership`, a
client of the run's store (the ``TCPStore`` rank 0's process serves at ``MASTER_ADDR:MASTER_PORT``).
The group the function formed with ``init_process_group`` is generation 0. When a collective fails
because a peer went away, each survivor moves the store's generation from the one it was in to the
next (``compare_set``: the first mover wins, the others find it moved), leaves its broken group and
registers for the new generation; the rank that its task started in place of the lost one
registers too (its ``init_process_group`` is this module's). A generation is formed once
``WORLD_SIZE`` ranks registered for it: each then joins a process group whose rendezvous keys lie
under that generation's prefix of the same store, so no key of an older group is read again. A rank
that finds the generation already formed without it (a later loss) waits for the next one.

Rank 0's process serves the store (with ``executor_loss="replace"`` the driver does, and a lost
rank 0 is replaced as any other rank). When it is lost, its task starts a rank 0 that serves a new,
empty store on the same socket; each survivor's store calls then fail, it connects again (the
connection waits in the socket's backlog until the new store serves it), finds another store's id
under :data:`ID_KEY`, and starts over at generation 0 of the new store with the new rank 0.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from ... import errors
from .. import backends, protocol

PREFIX = "sparkml_dist/elastic"
GEN_KEY = f"{PREFIX}/gen"
ID_KEY = f"{PREFIX}/store"  # set once per store: a rank that finds another id knows rank 0 was replaced
DONE_KEY = f"{PREFIX}/done"  # set by a rank whose function returned: the training is over
POLL_S = 0.05

_CURRENT: Optional["Membership"] = None


class Membership:
    """This rank's place in the run's generations (see the module docstring)."""

    def __init__(self, replaces: bool) -> None:
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.timeout = backends.collective_timeout()
        self.store_id = self._connect()
        self.generation = -1 if replaces else 0  # a new rank was in none yet
        self.torch_backend: Optional[str] = None

    def _connect(self) -> bytes:
        """A client of the run's store; returns the store's id."""
        import uuid

        import torch.distributed as dist

        self.store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=self.timeout
        )
        self.store.add(GEN_KEY, 0)  # the key exists from now on (compare_set needs a value)
        return self.store.compare_set(ID_KEY, "", uuid.uuid4().hex)

    def _reconnect(self) -> None:
        """The store went away with rank 0: connect to the one its replacement serves."""
        import torch.distributed as dist

        end = time.monotonic() + self.timeout.total_seconds()
        while True:
            try:
                store_id = self._connect()
                break
            except dist.DistNetworkError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
        if store_id != self.store_id:  # a new store: its generations start again, with this rank
            self.store_id, self.generation = store_id, -1

    def _read(self) -> int:
        return int(self.store.add(GEN_KEY, 0))

    def reform(self) -> int:
        """A survivor: the group lost a rank. Leave it and form the next generation; returns it."""
        import torch.distributed as dist

        if dist.is_initialized():
            self.torch_backend = str(dist.get_backend())
            dist.destroy_process_group()
        while True:
            try:
                self.store.compare_set(GEN_KEY, str(self.generation), str(self.generation + 1))
                return self.join(self.torch_backend)
            except dist.DistNetworkError:  # the store's host (rank 0) was lost too
                self._reconnect()

    def join(self, torch_backend: Optional[str]) -> int:
        """Register for the next generation, wait until it is whole, join its process group."""
        import torch.distributed as dist

        generation = self._next_generation()
        dist.init_process_group(
            torch_backend,
            store=dist.PrefixStore(f"{PREFIX}/g{generation}/pg", self.store),
            rank=self.rank,
            world_size=self.world,
            timeout=self.timeout,
        )
        self.generation, self.torch_backend = generation, str(dist.get_backend())
        return generation

    def _next_generation(self) -> int:
        end = time.monotonic() + self.timeout.total_seconds()
        while True:
            generation = self._read()
            if generation > self.generation:
                joined = self.store.add(f"{PREFIX}/g{generation}/n", 1)
                if joined <= self.world and self._whole(generation, end):
                    return generation
            while self._read() == generation:  # formed without this rank, or not moved yet
                self._check(end, generation)
                time.sleep(POLL_S)

    def _whole(self, generation: int, end: float) -> bool:
        """True once every rank registered for ``generation``; False if the run moved past it."""
        key = f"{PREFIX}/g{generation}/n"
        while self.store.add(key, 0) < self.world:
            if self._read() != generation:
                return False
            self._check(end, generation)
            time.sleep(POLL_S)
        return True

    def done(self) -> None:
        """This rank's function returned (not only an ``elastic.run`` inside it: a function may
        hold several): a rank still waiting for a generation (one started in place of a rank lost
        after the last collective) has nothing left to join."""
        try:
            self.store.set(DONE_KEY, "1")
        except Exception:  # the store went with its host: a waiting rank times out as before
            pass

    def _check(self, end: float, generation: int) -> None:
        if self.store.check([DONE_KEY]):  # the others trained to the end and returned
            _end_here(
                f"[sparkml_dist] rank {self.rank} ends without training: the other ranks finished "
                "the training before it joined",
                protocol.EVENT_OVER,
            )
        if time.monotonic() > end:
            joined = self.store.add(f"{PREFIX}/g{generation}/n", 0)
            raise errors.WorkerError(
                f"elastic.run: rank {self.rank} waited collective_timeout="
                f"{self.timeout.total_seconds():.0f}s for the ranks of generation {generation} "
                f"({min(joined, self.world)} of {self.world} came): the lost rank was not replaced "
                "(its task ran out of max_restarts, or its executor is gone)"
            )


def current() -> Membership:
    """This rank's membership (made on first use: a rank of generation 0)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = Membership(replaces=False)
    return _CURRENT


def join_on_init() -> None:
    """In a rank started in place of a lost one: its function's ``init_process_group`` (whatever
    it passes) joins the run's next generation instead of a rendezvous of its own."""
    global _CURRENT
    import torch.distributed as dist

    real = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        global _CURRENT
        dist.init_process_group = real  # the hooks under it (reaching the rendezvous) see this call
        _CURRENT = Membership(replaces=True)
        _CURRENT.join(backend)

    dist.init_process_group = init_process_group


def function_returned() -> None:
    """Called by the rank process once the run's function returned (see :meth:`Membership.done`)."""
    if _CURRENT is not None:
        _CURRENT.done()


def replaces() -> bool:
    """This rank process was started in place of one lost inside ``elastic.run``."""
    return bool(os.environ.get(protocol.REPLACES_ENV))


def leave_if_noticed(commits: int) -> None:
    """At a commit: when the driver said this rank's executor is being decommissioned (its notice
    in the rank's work directory; ``executor_loss="replace"``), say so, tell the task and leave the
    process.  Its task then ends for Spark to run it again on an executor that stays, and the others
    go back to this same commit when they find the rank gone: no completed step is redone."""
    if os.environ.get(protocol.LEAVE_ENV) != "1":
        return
    workdir = os.environ.get(protocol.WORKDIR_ENV, "")
    if not workdir or not os.path.exists(os.path.join(workdir, protocol.NOTICE_FILE)):
        return
    rank = _CURRENT.rank if _CURRENT is not None else os.environ.get("RANK", "?")
    said = f"[sparkml_dist] rank {rank} leaves at commit {commits}: its executor is being decommissioned"
    _end_here(said, protocol.EVENT_LEAVE, commits=commits)


def _end_here(said: str, event: str, **fields) -> None:
    """Say ``said``, tell the task ``event`` and end this rank's process now (the task ends
    without failing the run).  To its peers, as a lost process: their next collective fails."""
    import sys

    from .. import rank_channel

    rank_channel.send_log(said)
    rank_channel.send(event, **fields)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
