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
Generation 0 is never formed by registering (it is the function's own group): a rank that
registers there waits for the next one.

**A world that shrinks and grows in place** (``executor_loss="replace"`` with ``min_np``:
:data:`~sparkml_dist.runner.protocol.RESIZE_ENV`): a generation is also formed by fewer ranks,
``min_np`` or more, once the first of them has waited ``resize_wait`` seconds for the rest; the
first to decide fixes its size in the store (``compare_set``), and the first that many to register
are its members, ranked in the order of the ranks their tasks started them as (so a whole world
has every rank at its own number again). ``RANK`` and ``WORLD_SIZE`` change with it. A rank that
registers beyond a formed generation's members (a lost executor's rank that came back) is seen at
the members' next commit: rank 0 reads the store and tells the others (one small broadcast a
commit), and all of them form the next generation with it (:class:`Regrow`).

Rank 0's process serves the store (with ``executor_loss="replace"`` the driver does, and a lost
rank 0 is replaced as any other rank). When it is lost, its task starts a rank 0 that serves a new,
empty store on the same socket; each survivor's store calls then fail, it connects again (the
connection waits in the socket's backlog until the new store serves it), finds another store's id
under :data:`ID_KEY`, and starts over at generation 0 of the new store with the new rank 0.
"""

from __future__ import annotations

import os
import time
from typing import List, Optional, Tuple

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
        self.origin, self.full = self.rank, self.world  # the rank its task started, the run's world
        self.min_np, self.wait = protocol.resize_settings()  # (None, 0.0): every generation is the full world
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
            self.store_id, self.generation = store_id, 0  # (as a member of its 0: it moves on to 1)

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

        generation, members = self._next_generation()
        self.rank, self.world = members.index(self.origin), len(members)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(self.rank), str(self.world)
        dist.init_process_group(
            torch_backend,
            store=dist.PrefixStore(f"{PREFIX}/g{generation}/pg", self.store),
            rank=self.rank,
            world_size=self.world,
            timeout=self.timeout,
        )
        self.generation, self.torch_backend = generation, str(dist.get_backend())
        return generation

    def _next_generation(self) -> Tuple[int, List[int]]:
        """(the generation this rank joins, its members' original ranks in order: a member's rank
        in it is its place there)."""
        end = time.monotonic() + self.timeout.total_seconds()
        while True:
            generation = self._read()
            if generation > self.generation:
                ticket = self.store.add(f"{PREFIX}/g{generation}/n", 1)
                self.store.set(f"{PREFIX}/g{generation}/o{ticket}", str(self.origin))
                size = self._size(generation, end)
                if size is not None and ticket <= size:  # one of the first `size` to register: in
                    origins = [self.store.get(f"{PREFIX}/g{generation}/o{t}") for t in range(1, size + 1)]
                    return generation, sorted(int(o) for o in origins)
            while self._read() == generation:  # formed without this rank, or not moved yet
                self._check(end, generation)
                time.sleep(POLL_S)

    def _size(self, generation: int, end: float) -> Optional[int]:
        """How many ranks ``generation`` has (the first to register are its members): the run's
        whole world once all registered; with ``min_np``, the ranks registered after waiting
        ``resize_wait`` seconds for the rest, if at least ``min_np``.  The first rank to decide
        fixes it for all (``compare_set``).  None if the run moved past the generation."""
        if generation == 0:  # formed by the function's own init_process_group: a registrant waits
            return 0
        key, fixed = f"{PREFIX}/g{generation}/n", f"{PREFIX}/g{generation}/size"
        since = time.monotonic()
        while not self.store.check([fixed]):
            joined = int(self.store.add(key, 0))
            waited = time.monotonic() - since >= self.wait
            if joined >= self.full or (self.min_np and joined >= self.min_np and waited):
                self.store.compare_set(fixed, "", str(min(joined, self.full)))
                break
            if self._read() != generation:
                return None
            self._check(end, generation)
            time.sleep(POLL_S)
        return int(self.store.get(fixed))

    def joiners(self) -> bool:
        """At a commit of a run that resizes (``min_np``): whether ranks registered beyond the
        current generation's members (a lost executor's ranks that came back), as rank 0 sees the
        store: every rank gets its answer, so all of them form the next, larger generation at
        the same commit."""
        import torch
        import torch.distributed as dist

        waiting = 0
        if self.rank == 0:  # generation 0 had no registrants: anyone registered there is a joiner
            members = self.world if self.generation > 0 else 0
            waiting = int(int(self.store.add(f"{PREFIX}/g{self.generation}/n", 0)) > members)
        flag = torch.tensor([waiting], dtype=torch.int64, device=device())
        dist.broadcast(flag, 0)
        return bool(flag.item())

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


class Regrow(Exception):
    """Raised at a commit when ranks wait to join a run that went on with fewer (``min_np``):
    :func:`sparkml_dist.runner.elastic.run` forms the next generation with them, from that commit."""


def device():
    """Where this rank's small collectives go: its GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"


def at_commit(commits: int) -> None:
    """A commit: a rank whose executor is being decommissioned leaves here
    (:func:`leave_if_noticed`); in a run that resizes, ranks waiting to join make every rank
    raise :class:`Regrow` (the same answer on every rank: rank 0's)."""
    leave_if_noticed(commits)
    member = _CURRENT
    if member is None or member.min_np is None or member.generation < 0:
        return
    import torch.distributed as dist

    if dist.is_initialized() and member.joiners():
        raise Regrow(f"ranks wait to join at commit {commits}")


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
