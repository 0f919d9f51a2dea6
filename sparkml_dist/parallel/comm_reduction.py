"""A worker's side of the reduction servers: DDP's buckets summed off the workers.  [rank]

``BarrierRunner(np, comm={"reduction_servers": k})`` starts ``k`` CPU reduction servers beside
the ``np`` workers (:mod:`sparkml_dist.runner.backends.reducers`); ``comm.ddp(model)`` then
registers :func:`hook` instead of DDP's all-reduce. Each bucket is divided by the world size (as
DDP's own hook does), cut into ``k`` contiguous shards, and shard ``j`` goes to server ``j``,
which sends back the sum of every worker's shard ``j``. The sends and receives run on one
communication thread per process, in the order DDP hands over its buckets, so the backward pass
goes on computing meanwhile (the future DDP waits on completes when the sums are in).

Each worker sends and receives each gradient byte once (a ring all-reduce: ``2 (np - 1) / np``
times), and the sums are taken in rank order on the servers: the same as DDP's all-reduce within
float32 rounding (the truth matrix's row, docs/truth.md). With ``compression="fp16"`` or
``"bf16"`` the shards and sums travel in that dtype (half the bytes again) and the servers add in
float32.

Example (what ``comm.ddp`` does when the run has reduction servers)::

    client = Client.of_run()                     # one per process: the group of workers + servers
    net.register_comm_hook(client, hook)
"""

from __future__ import annotations

import queue
import threading
from typing import Optional

import torch
import torch.distributed as dist

from ..runner import comm_settings


class Client:
    """This worker's end of the group of workers and servers, and the thread that talks to them."""

    _of_run: Optional["Client"] = None
    _lock = threading.Lock()

    def __init__(self, servers: int) -> None:
        from ..runner.backends import reducers  # the wire the servers speak (a rank has it loaded)

        self.wire = reducers
        self.rank, self.workers, self.servers = dist.get_rank(), dist.get_world_size(), servers
        self.pg = reducers.group(self.rank, self.workers, servers)
        self.buckets = 0  # buckets summed by the servers
        self.bytes_sent = 0  # gradient bytes this worker sent to the servers
        self._queue: "queue.Queue" = queue.Queue()  # buckets to send
        self._posted: "queue.Queue" = queue.Queue()  # buckets sent, their sums awaited
        threading.Thread(target=self._post, name="sparkml_dist-reduction-post", daemon=True).start()
        threading.Thread(target=self._complete, name="sparkml_dist-reduction-sums", daemon=True).start()

    @classmethod
    def of_run(cls) -> "Client":
        """The process's client for the run's servers (made on first use: every worker makes it
        in the same call, ``comm.ddp``, so the group forms)."""
        with cls._lock:
            if cls._of_run is None:
                cls._of_run = cls(servers_of_run())
            return cls._of_run

    def submit(self, tensor: torch.Tensor) -> torch.futures.Future:
        """A future of ``tensor`` summed over the workers (in place), once the servers answer."""
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((tensor, fut))
        return fut

    def _post(self) -> None:
        """Each bucket's chunks sent as DDP hands them over, without waiting for earlier sums."""
        while True:
            tensor, fut = self._queue.get()
            try:
                pending = self._send(tensor)
            except BaseException as exc:  # the backward pass that waits on it raises it
                fut.set_exception(exc)
            else:
                self._posted.put((tensor, fut, pending))

    def _send(self, tensor: torch.Tensor):
        """``tensor``'s shards sent to their servers in chunks, and a receive posted for each
        chunk's sum: (the receives, (chunk, sum) pairs).

        Every header goes first (a server starts a round once all its workers' headers are in).
        Then round by round, one chunk to each server in turn, worker ``w`` starting at server
        ``w``: at a time each link carries one flow, as a ring's step does (4 flows sharing a
        worker's link, in lock-step rounds, measured 0.74x the ring at 1 Gbit/s). The next chunk
        goes once the last one's bytes are out; the sums of a round come down meanwhile."""
        wire, n, k = self.wire, self.workers, self.servers
        shards = torch.tensor_split(tensor.view(-1), k)
        most = wire.chunk_elements(tensor.dtype)
        chunks = [torch.split(shard, most) if shard.numel() else () for shard in shards]
        recvs, sums = [], []
        for j, shard in enumerate(chunks):
            for i, c in enumerate(shard):
                head = wire.header(c.numel(), c.dtype, more=i + 1 < len(shard))
                recvs.append(self.pg.send([head], n + j, wire.HEADER))
                out = torch.empty_like(c)
                recvs.append(self.pg.recv([out], n + j, wire.SUM))
                sums.append((c, out))
        for r in range(max(len(shard) for shard in chunks)):
            for p in range(k):
                j = (self.rank + p) % k
                if r < len(chunks[j]):
                    self.pg.send([chunks[j][r]], n + j, wire.SHARD).wait()
                    self.bytes_sent += chunks[j][r].numel() * chunks[j][r].element_size()
        return recvs, sums

    def _complete(self) -> None:
        """Each bucket's future completed, in DDP's order, once all its sums are in."""
        while True:
            tensor, fut, (works, sums) = self._posted.get()
            try:
                for w in works:
                    w.wait()
                for chunk, out in sums:
                    chunk.copy_(out)
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                self.buckets += 1
                fut.set_result(tensor)


# the dtype a bucket's shards and sums travel in, per ``compression``: the servers add in float32
WIRE = {None: None, "fp16": torch.float16, "bf16": torch.bfloat16}


def hook(client: Client, bucket, wire: Optional[torch.dtype] = None) -> torch.futures.Future:
    """DDP's communication hook: the bucket's mean over the workers, summed by the servers; with
    ``wire`` (a half dtype), each worker's share is rounded to it once, the sum taken in float32
    and rounded once more on its way back (a half-precision ring rounds at every one of its steps)."""
    tensor = bucket.buffer()
    tensor.div_(client.workers)  # as DDP's all-reduce hook: each worker's share, then the sum
    if wire is None or tensor.dtype == wire:
        return client.submit(tensor)

    def widened(fut: torch.futures.Future) -> torch.Tensor:
        tensor.copy_(fut.value())
        return tensor

    return client.submit(tensor.to(wire)).then(widened)


def servers_of_run() -> int:
    """How many reduction servers the run started (``comm={"reduction_servers": k}``; 0: none)."""
    return int(comm_settings.of_run().get("reduction_servers") or 0)
