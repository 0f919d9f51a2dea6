"""One barrier task: start the rank process, feed it, rendezvous, watch it.  [executor]

``barrier_task(batches, spec)`` is the ``mapInArrow(..., barrier=True)`` function.  The same
:func:`supervise` also runs on the driver in threads for ``np < 0`` (with a thread-based gang).
What the task and its rank process exchange is in :mod:`sparkml_dist.runner.protocol`.

Failure semantics: when the rank process exits non-zero, dies of a signal, or does not reach the
rendezvous within ``start_timeout``, the task kills the rank's process group, reports the failure on
the log channel (so the driver cancels the job at once) and raises
:class:`~sparkml_dist.runner.protocol.RankFailure`.  Spark then aborts the barrier stage and kills
the other tasks; their rank processes die with them (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import pyarrow as pa

from .. import collection, parquet_split
from . import backends, network, protocol, rendezvous
from ._rank_process import RankProcess, exit_text
from .channel import LogClient
from .protocol import RankFailure


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, as plain values built on the driver."""

    run_id: str
    world_size: int
    payload: bytes  # serialized (main, args, kwargs, want_result)
    backend: str  # a name in backends.BACKENDS
    use_gpu: bool
    log_ranks: Tuple[int, ...]  # ranks whose output is streamed
    channel: Optional[Tuple[str, int]]  # the driver's log server, or None
    secret: bytes
    start_timeout: Optional[float]
    collective_timeout: float
    has_data: bool
    return_all: bool
    max_result_bytes: int
    env: Tuple[Tuple[str, str], ...] = ()
    file_split: Optional[parquet_split.ParquetSplit] = None  # shards read from Parquet files


class SparkGang:
    """The barrier task context as the supervisor sees it."""

    def __init__(self) -> None:
        from pyspark import BarrierTaskContext

        self._ctx = BarrierTaskContext.get()
        self.rank = self._ctx.partitionId()

    def allgather(self, message: str) -> List[str]:
        return list(self._ctx.allGather(message))

    def resources(self) -> dict:
        return self._ctx.resources()


class ThreadGang:
    """A gang of threads on one machine: for ``np < 0`` and for tests without Spark."""

    def __init__(self, size: int, timeout: Optional[float] = None) -> None:
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: List[Optional[str]] = [None] * size

    def member(self, rank: int) -> "_ThreadMember":
        return _ThreadMember(self, rank)


class _ThreadMember:
    def __init__(self, gang: ThreadGang, rank: int) -> None:
        self._gang, self.rank = gang, rank

    def allgather(self, message: str) -> List[str]:
        self._gang._slots[self.rank] = message
        self._gang._barrier.wait()
        out = list(self._gang._slots)
        self._gang._barrier.wait()
        return out

    def abort(self) -> None:
        self._gang._barrier.abort()

    def resources(self) -> dict:
        return {}


def _write_shard(batches: Iterable[pa.RecordBatch], path: str) -> int:
    """Stream the task's batches into an Arrow IPC file (an empty file of no columns for none);
    returns the row count."""
    rows, writer = 0, None
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(path, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pa.ipc.new_file(path, pa.schema([])).close()
    return rows


class _RankTask:
    """One rank under one task: each method is one step of :func:`supervise`."""

    def __init__(self, gang, spec: TaskSpec, cancel: Optional[threading.Event]) -> None:
        self.gang, self.spec, self.rank, self.cancel = gang, spec, gang.rank, cancel
        self.backend = backends.get(spec.backend)
        self.started = time.monotonic()
        self.gpus = rendezvous.task_gpus(gang.resources(), spec.use_gpu, self.rank)
        base = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
        self.workdir = tempfile.mkdtemp(prefix=f"sparkml_dist-{spec.run_id}-r{self.rank}-", dir=base)
        self.client: Optional[LogClient] = None
        self.process: Optional[RankProcess] = None
        self.rows = 0

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def fail(self, message: str, code: Optional[int] = None, phase: str = "run") -> RankFailure:
        detail = {
            "rank": self.rank,
            "exit_code": code,
            "phase": phase,
            "message": message,
            "tail": self.process.lines() if self.process else [],
            "failed_at": time.time(),
        }
        self._report(protocol.FRAME_FAILED, **detail)
        return RankFailure(detail)

    def _report(self, frame: str, **fields) -> None:
        if self.client is not None:
            self.client.send({"type": frame, "rank": self.rank, **fields})

    def start(self) -> int:
        """Start the rank process first: its interpreter and torch import (seconds) overlap with
        connecting the log channel, writing the shard and the gang exchange. Returns the store port.

        Rank 0's process hosts the rendezvous (torch's TCPStore, or Horovod's HTTP store) on a
        socket bound and listening now: its port is known before torch is imported, and peers that
        connect early wait in the backlog.
        """
        spec, listener, port = self.spec, None, 0
        env = {
            **protocol.without_spark_secrets(os.environ),
            **dict(spec.env),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(spec.world_size),
            "PYTHONUNBUFFERED": "1",
            protocol.TIMEOUT_ENV: str(spec.collective_timeout),
            protocol.BACKEND_ENV: spec.backend,
            protocol.RUN_ENV: spec.run_id,
            protocol.USE_GPU_ENV: "1" if spec.use_gpu else "0",
        }
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        try:
            if self.rank == 0:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.bind((network.host_address(), 0))  # the address the peers are given
                listener.listen(1024)
                port = listener.getsockname()[1]
                env[protocol.STORE_FD_ENV] = str(listener.fileno())
            self.process = RankProcess(
                self.rank, self.workdir, env, pass_fds=(listener.fileno(),) if listener else ()
            )
        finally:
            if listener is not None:
                listener.close()  # the rank process holds its own copy
        if spec.channel is not None:
            try:
                self.client = LogClient(spec.channel[0], spec.channel[1], spec.secret)
            except OSError:
                self.client = None  # the driver is unreachable (a remote Connect client): no live logs
        self.process.watch(forward=self.rank in spec.log_ranks, client=self.client)
        return port

    def feed(self, batches: Iterable[pa.RecordBatch]) -> Dict[str, str]:
        """Write the shard and the function into the work directory; the shard's environment."""
        spec, env = self.spec, {}
        if not spec.has_data or spec.file_split is not None:
            for _ in batches:  # drain the placeholder rows, so Spark can reuse this Python worker
                pass
        if spec.has_data:
            path = os.path.join(self.workdir, protocol.SHARD_FILE)
            source = batches if spec.file_split is None else parquet_split.read(spec.file_split, self.rank)
            self.rows = _write_shard(source, path)
            env[protocol.SHARD_ENV] = path
        with open(os.path.join(self.workdir, protocol.FN_FILE), "wb") as fh:
            fh.write(spec.payload)
        return env

    def exchange(self, port: int, shard_env: Dict[str, str]) -> None:
        """All-gather the peers' addresses and shard sizes; send the rank its start message."""
        me = protocol.announce(network.host_address(), port, self.rows, self.gpus)
        peers = protocol.peers(self.gang.allgather(me))
        env, extra = self.backend.rank_env(self.rank, peers, self.gpus, self.spec.collective_timeout)
        env.update(shard_env)
        env[protocol.SHARD_SIZES_ENV] = json.dumps([p["rows"] for p in peers])
        self.process.send_start(protocol.start_message(env, **extra))

    def await_rendezvous(self) -> None:
        """Wait until the rank joins the rendezvous (or ends); fail it after ``start_timeout``."""
        spec = self.spec
        deadline = self.started + spec.start_timeout if spec.start_timeout else None
        ev = self.process.wait_event(protocol.EVENT_RENDEZVOUS, deadline, self.cancelled)
        if ev is None and self.process.running and not self.cancelled():
            self.process.kill()
            self.process.join_output()
            raise self.fail(
                f"rank {self.rank} did not reach the rendezvous ({self.backend.start_call}) "
                f"within start_timeout={spec.start_timeout}s",
                None,
                "rendezvous",
            )
        if ev is not None:
            self._report(protocol.FRAME_RENDEZVOUS)

    def await_exit(self) -> None:
        code = self.process.wait_exit(self.cancel)
        if code is None:
            raise self.fail(f"rank {self.rank} was stopped because the run was cancelled", None, "cancelled")
        if code != 0:
            raise self.fail(f"rank {self.rank} {exit_text(code)}", code)

    def result(self) -> Iterator[pa.RecordBatch]:
        """The result as chunk rows (rank 0, or every rank with ``return_all``)."""
        if self.rank == 0 or self.spec.return_all:
            path = os.path.join(self.workdir, protocol.RESULT_FILE)
            size = os.path.getsize(path)
            if size > self.spec.max_result_bytes:
                raise self.fail(
                    f"the result of rank {self.rank} is {size} bytes, more than the driver accepts "
                    f"(spark.driver.maxResultSize = {self.spec.max_result_bytes} bytes). Write large "
                    "results to storage (e.g. sparkml_dist.collection.ModelStore or torch.save to "
                    "a shared path) and return the path instead.",
                    0,
                    "result",
                )
            with open(path, "rb") as fh:
                yield collection.encode_bytes(self.rank, 0, fh.read())
        self._report(protocol.FRAME_DONE)

    def cleanup(self) -> None:
        if self.process is not None:
            self.process.close()
        if self.client is not None:
            self.client.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def supervise(
    gang, batches: Iterable[pa.RecordBatch], spec: TaskSpec, cancel: Optional[threading.Event] = None
) -> Iterator[pa.RecordBatch]:
    """Run one rank under this task; yields its result as chunk rows (rank 0, or all).

    ``cancel`` (local mode) stops the rank when set; under Spark the task itself is killed.
    """
    task = _RankTask(gang, spec, cancel)
    try:
        port = task.start()
        shard_env = task.feed(batches)
        task.exchange(port, shard_env)
        task.await_rendezvous()
        task.await_exit()
        yield from task.result()
    finally:
        task.cleanup()


def barrier_task(batches: Iterable[pa.RecordBatch], spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """The mapInArrow(barrier=True) function: one rank per partition."""
    yield from supervise(SparkGang(), batches, spec)
