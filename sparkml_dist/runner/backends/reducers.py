"""Reduction servers: the gradient sums the workers' DDP hook offloads, and the wire between them.  [rank]

With ``BarrierRunner(np, comm={"reduction_servers": k})`` the job holds ``np + k`` barrier tasks:
ranks ``0 .. np-1`` are the workers (they run the function; their torch world is the ``np`` of
them) and ranks ``np .. np+k-1`` the reduction servers, CPU processes that run no user code
(:class:`Server`). The worker's side is a DDP communication hook
(:mod:`sparkml_dist.parallel.comm_reduction`, what ``comm.ddp`` registers): each gradient bucket is
cut into ``k`` contiguous shards, shard ``j`` goes to server ``j``, which sums the ``np`` workers'
shards in rank order (half-precision shards in float32) and sends the sum back to each, in the
shards' dtype. A worker sends and receives each gradient byte once, where a ring all-reduce sends
and receives ``2 (np - 1) / np`` of them; the servers' links carry ``np / k`` of a bucket each.

Both sides meet in :func:`group`: a gloo process group of ``np + k`` members (the workers first,
by their torch rank, then the servers) on its own prefix of the run's rendezvous store. A shard
travels in chunks of at most :data:`CHUNK_BYTES` (:func:`chunk_elements`): per chunk a worker
sends its server a header (the element count, the dtype's code, whether another chunk of the
bucket follows) then the chunk, and receives the sum. A server serves one chunk a round, in the
order the workers send them (DDP launches its buckets in the same order on every rank), and
receives the next rounds while a round's sums go out (:data:`IN_FLIGHT` rounds at most). Gloo
moves a message only once its receiver has posted for it, so a server posts for a bucket's next
chunk while it awaits the current one (:data:`AHEAD`): a link carries chunks up and sums down at
once, as the ring's full-duplex steps do.

A server ends when its task writes the stop file (the driver's ``FRAME_STOP``, sent once rank 0's
function is done) and it holds no bucket half-served: by then every worker has sent its last
bucket (rank 0 cannot have its last sums before the others sent theirs).

Example::

    pg = group(rank=5, workers=4, servers=2)       # in server 1 (rank 5 of the job)
    Server(store_fd=None, reached=lambda: None).serve(workdir)
"""

from __future__ import annotations

import collections
import os
import queue
import sys
import threading
import time
from typing import List, Optional

from .. import comm_settings, protocol
from .base import collective_timeout

PREFIX = "sparkml_dist/reduction_servers/"  # the group's keys in the run's store
HEADER, SHARD, SUM = 0, 1, 2  # the tags of a bucket's messages
DTYPES = ("float32", "float64", "float16", "bfloat16")  # a header's dtype code: the index here
POLL_S = 0.1  # how often a server looks for its stop file
CHUNK_BYTES = 4 << 20  # a message holds at most: the next chunks come in while a chunk's sums go out
IN_FLIGHT = 4  # rounds whose sums may still be going out while the server receives the next
AHEAD = 2  # rounds of one bucket whose chunks a server awaits at once (gloo sends a chunk once posted for)
ROLE = "reducer"  # protocol.ROLE_ENV of a server's rank


def server_env(rank: int, workers: int, master_addr: str, master_port: int) -> dict:
    """A server rank's environment: the run's store, its place after the ``workers``, no GPU."""
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(workers),  # the torch world is the workers'
        protocol.ROLE_ENV: ROLE,
        "CUDA_VISIBLE_DEVICES": "",
    }


def group(rank: int, workers: int, servers: int):
    """The gloo group of the workers and the servers (``rank``: the member's place in it: a
    worker's torch rank, ``workers + j`` for server ``j``), on the run's store."""
    import torch.distributed as dist

    timeout = collective_timeout()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return dist.ProcessGroupGloo(dist.PrefixStore(PREFIX, store), rank, workers + servers, timeout)


def chunk_elements(dtype) -> int:
    """The elements of ``dtype`` a chunk holds at most (:data:`CHUNK_BYTES` of them: a
    half-precision chunk holds twice float32's elements, so messages keep their size)."""
    import torch

    return CHUNK_BYTES // torch.empty(0, dtype=dtype).element_size()


def header(numel: int, dtype, more: bool):
    """A chunk's header: its elements, its dtype's code, and whether the same bucket has another
    chunk for this server (its header is then already sent: the server posts for it at once)."""
    import torch

    code = DTYPES.index(str(dtype).replace("torch.", ""))
    return torch.tensor([numel, code, int(more)], dtype=torch.int64)


def _wait(works) -> None:
    for w in works:
        w.wait()


class Server:
    """A reduction server's rank: sums the workers' shards until the run ends."""

    def __init__(self, reached) -> None:
        self.reached = reached
        self.workers = int(os.environ["WORLD_SIZE"])  # the torch world: the workers
        self.rank = int(os.environ["RANK"])  # this server's place in the group: workers + its index
        self.servers = int(comm_settings.of_run()["reduction_servers"])
        self.mid_round = False  # a round's headers received, its sums not yet posted
        self.sent = 0  # rounds whose sums have all gone out
        self._sends: "queue.Queue" = queue.Queue()  # each round's sum, to send in order
        self._room = threading.Semaphore(IN_FLIGHT)  # rounds whose sums may still be going out
        self.formed = False  # every worker joined the group
        self.served = 0  # buckets summed
        self.error: Optional[BaseException] = None

    @property
    def index(self) -> int:
        return self.rank - self.workers

    @property
    def busy(self) -> bool:
        """A round received and its sums not all sent yet."""
        return self.mid_round or self.sent < self.served

    def serve(self, workdir: str) -> None:
        worker = threading.Thread(target=self._guarded, args=(self._loop,), name="sparkml_dist-reduction")
        sums = threading.Thread(target=self._guarded, args=(self._drain,), name="sparkml_dist-reduction-sums")
        for t in (worker, sums):
            t.daemon = True
            t.start()
        stop = os.path.join(workdir, protocol.STOP_FILE)
        while worker.is_alive() and sums.is_alive() and not os.path.exists(stop):
            time.sleep(POLL_S)
        end = time.monotonic() + collective_timeout().total_seconds()
        while worker.is_alive() and sums.is_alive() and self.busy and time.monotonic() < end:  # sums go out
            time.sleep(POLL_S / 10)
        if self.error is not None:
            raise self.error
        if not self.formed:
            print(
                f"reduction server {self.index}: no worker joined (a model wrapped with "
                "sparkml_dist.parallel.comm.ddp sends its gradients here; plain "
                "DistributedDataParallel all-reduces among the workers)",
                file=sys.stderr,
                flush=True,
            )

    def _guarded(self, loop) -> None:
        try:
            loop()
        except BaseException as exc:  # the rank fails with it: the main thread raises it
            self.error = exc

    def _drain(self) -> None:
        """Each round's sums sent to one worker after another, starting at a different worker on
        each server (so a worker's link carries one server's sums at a time, not all at once): a
        round is served once its sums have gone out."""
        while True:
            total = self._sends.get()
            n = self.workers
            for q in range(n):
                self.pg.send([total], (self.index + q) % n, SUM).wait()
            self.sent += 1
            self._room.release()

    def _loop(self) -> None:
        self.reached()  # the store is joined by the group's first step
        self.pg = group(self.rank, self.workers, self.servers)
        self.formed = True
        posted: "collections.deque" = collections.deque()  # rounds whose chunks are awaited
        while True:  # one round a chunk: its sums go out while the next chunks come in
            if not posted:
                posted.append(self._post_round())  # waits for the next bucket's headers
            parts, works, more = posted[0]
            if more and len(posted) < AHEAD:  # the bucket's next headers are out: post its chunks now
                posted.append(self._post_round())
            _wait(works)
            posted.popleft()
            total = parts[0].float() if parts[0].element_size() < 4 else parts[0]  # halves: in float32
            for p in parts[1:]:
                total += p  # in rank order: the same sum on every run
            total = total.to(parts[0].dtype)
            self._room.acquire()
            self._sends.put(total)
            self.served += 1
            self.mid_round = bool(posted)

    def _post_round(self):
        """The next round's headers received and a receive posted for each worker's chunk: (the
        chunks, their receives, whether this server gets another chunk of the same bucket)."""
        import torch

        n, pg = self.workers, self.pg
        heads = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
        _wait([pg.recv([h], w, HEADER) for w, h in enumerate(heads)])
        self.mid_round = True
        numel, code, more = _agreed(heads, self.index)
        parts = [torch.empty(numel, dtype=getattr(torch, DTYPES[code])) for _ in range(n)]
        return parts, [pg.recv([p], w, SHARD) for w, p in enumerate(parts)], more


def _elements(code: int) -> int:
    import torch

    return chunk_elements(getattr(torch, DTYPES[code]))


def _agreed(heads: List, index: int):
    """The chunk's size, dtype and whether another follows, the same from every worker, or an
    error naming the mismatch."""
    seen = {(int(h[0]), int(h[1]), int(h[2])) for h in heads}
    if any(not 0 <= code < len(DTYPES) or not 0 < numel <= _elements(code) or more not in (0, 1)
           for numel, code, more in seen):  # fmt: skip
        raise RuntimeError(f"reduction server {index}: a header that no worker of this run sends: {seen}")
    if len(seen) != 1:
        said = ", ".join(f"worker {w}: {int(h[0])} x {DTYPES[int(h[1])]}" for w, h in enumerate(heads))
        raise RuntimeError(
            f"reduction server {index}: the workers sent different buckets ({said}): every worker must "
            "wrap the same model with comm.ddp and step it the same number of times"
        )
    return seen.pop()
