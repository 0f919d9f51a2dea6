"""One barrier task: write the shard, start the rank process, rendezvous, watch it.  [executor]

``barrier_task(batches, spec)`` is the ``mapInArrow(..., barrier=True)`` function.  The same
:func:`supervise` also runs on the driver in threads for ``np < 0`` (with a thread-based gang).

Failure semantics: when the rank process exits non-zero, dies of a signal, or does not reach the
rendezvous within ``start_timeout``, the task kills the rank's process group, reports the failure on
the log channel (so the driver cancels the job at once) and raises :class:`RankFailure`, whose
message carries the details as JSON after :data:`FAILURE_MARKER` (so they survive any transport of
Spark's error, Spark Connect included).  Spark then aborts the barrier stage and kills the other
tasks; their rank processes die with them (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import pyarrow as pa

from .. import collection, parquet_split
from . import _rank, data, rendezvous
from .channel import LogClient

FAILURE_MARKER = "SPARKML_DIST_RANK_FAILURE:"
_RANK_ENTRY = "from sparkml_dist.runner._rank import run; run()"
TAIL_LINES = 40


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, as plain values built on the driver."""

    run_id: str
    world_size: int
    payload: bytes                      # serialized (main, args, kwargs)
    backend: str                        # "torch" | "horovod"
    use_gpu: bool
    log_ranks: Tuple[int, ...]          # ranks whose output is streamed
    channel: Optional[Tuple[str, int]]  # the driver's log server, or None
    secret: bytes
    start_timeout: Optional[float]
    collective_timeout: float
    has_data: bool
    return_all: bool
    max_result_bytes: int
    env: Tuple[Tuple[str, str], ...] = ()
    file_split: Optional[parquet_split.ParquetSplit] = None  # shards read from Parquet files


class RankFailure(RuntimeError):
    """Raised by a task whose rank failed; the message ends with a JSON detail after the marker."""

    def __init__(self, detail: dict) -> None:
        self.detail = detail
        super().__init__(f"{detail['message']} {FAILURE_MARKER}{json.dumps(detail)}")


def parse_failure(text: str) -> Optional[dict]:
    """The failure detail embedded in an error text by :class:`RankFailure`, if any."""
    at = text.find(FAILURE_MARKER)
    if at < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[at + len(FAILURE_MARKER):])[0]
    except ValueError:
        return None


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


def _host_address() -> str:
    """An address of this host other ranks can reach (the one used to reach the outside)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent for a UDP connect
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _interface_of(address: str) -> Optional[str]:
    """The network interface holding ``address`` (Horovod's Gloo device binds it), if known."""
    try:
        import psutil  # a dependency of Horovod, so present wherever backend="horovod" runs
    except ImportError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


def _write_shard(batches: Iterable[pa.RecordBatch], path: str) -> int:
    """Stream the task's batches into an Arrow IPC file; returns the row count."""
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
    return rows


class _Watcher:
    """Reads a rank's stdout/stderr/control pipes: keeps the tail, forwards lines and events."""

    def __init__(self, proc: subprocess.Popen, ctrl_fd: int, rank: int, forward: bool,
                 client: Optional[LogClient]) -> None:
        self.tail: "collections.deque[str]" = collections.deque(maxlen=TAIL_LINES)
        self.events: "queue.Queue[dict]" = queue.Queue()
        self._rank, self._forward, self._client = rank, forward, client
        self._threads = [
            threading.Thread(target=self._lines, args=(proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._lines, args=(proc.stderr, "stderr"), daemon=True),
            threading.Thread(target=self._ctrl, args=(ctrl_fd,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _lines(self, pipe, stream: str) -> None:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(text)
            if self._forward and self._client is not None:
                self._client.send({"type": "line", "rank": self._rank, "stream": stream, "text": text})
        pipe.close()

    def _ctrl(self, fd: int) -> None:
        with os.fdopen(fd, "r") as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "log":  # log_to_driver: streamed whatever log_ranks says
                    text = str(event.get("text", ""))
                    self.tail.append(text)
                    if self._client is not None:
                        self._client.send({"type": "line", "rank": self._rank, "stream": "log", "text": text})
                    continue
                self.events.put(event)

    def join(self, timeout: float = 2.0) -> None:
        for t in self._threads:
            t.join(timeout)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def supervise(gang, batches: Iterable[pa.RecordBatch], spec: TaskSpec,
              cancel: Optional[threading.Event] = None) -> Iterator[pa.RecordBatch]:
    """Run one rank under this task; yields its result as chunk rows (rank 0, or all).

    ``cancel`` (local mode) stops the rank when set; under Spark the task itself is killed.
    """
    rank = gang.rank
    started = time.monotonic()
    base = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
    workdir = tempfile.mkdtemp(prefix=f"sparkml_dist-{spec.run_id}-r{rank}-", dir=base)
    client: Optional[LogClient] = None
    proc: Optional[subprocess.Popen] = None
    watcher: Optional[_Watcher] = None
    listener: Optional[socket.socket] = None
    store_port = 0

    def fail(message: str, code: Optional[int] = None, phase: str = "run") -> RankFailure:
        tail = list(watcher.tail) if watcher else []
        detail = {"rank": rank, "exit_code": code, "phase": phase, "message": message, "tail": tail,
                  "failed_at": time.time()}
        if client is not None:
            client.send({"type": "failed", **detail})
        return RankFailure(detail)

    try:
        # Start the rank process first: its interpreter and torch import (seconds) overlap with
        # connecting the log channel, writing the shard and the gang rendezvous.
        gpus = rendezvous.task_gpus(gang.resources(), spec.use_gpu, rank)
        ctrl_r, ctrl_w = os.pipe()
        fds = [ctrl_w]
        if rank == 0:
            # rank 0's process hosts the rendezvous (torch's TCPStore, or Horovod's HTTP store) on
            # this socket, bound and listening now: its port is known before torch is imported, and
            # peers that connect early wait in the backlog.
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("0.0.0.0", 0))
            listener.listen(1024)
            store_port = listener.getsockname()[1]
            fds.append(listener.fileno())
        env = dict(os.environ)
        env.update(dict(spec.env))
        env.update({
            "RANK": str(rank), "WORLD_SIZE": str(spec.world_size), "PYTHONUNBUFFERED": "1",
            _rank.WORKDIR_ENV: workdir, _rank.CTRL_ENV: str(ctrl_w), _rank.PARENT_ENV: str(os.getpid()),
            _rank.TIMEOUT_ENV: str(spec.collective_timeout), _rank.BACKEND_ENV: spec.backend,
            _rank.RUN_ENV: spec.run_id, _rank.USE_GPU_ENV: "1" if spec.use_gpu else "0",
        })
        if listener is not None:
            env[_rank.STORE_FD_ENV] = str(listener.fileno())
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        proc = subprocess.Popen([sys.executable, "-c", _RANK_ENTRY], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=tuple(fds), cwd=workdir, start_new_session=True)
        os.close(ctrl_w)
        if listener is not None:
            listener.close()  # the rank process holds its own copy
        if spec.channel is not None:
            try:
                client = LogClient(spec.channel[0], spec.channel[1], spec.secret)
            except OSError:
                client = None  # the driver is unreachable (e.g. a remote Connect client): no live logs
        watcher = _Watcher(proc, ctrl_r, rank, rank in spec.log_ranks, client)
        deadline = started + spec.start_timeout if spec.start_timeout else None
        go_env: Dict[str, str] = {}
        rows = 0
        if not spec.has_data or spec.file_split is not None:
            for _ in batches:  # drain the placeholder rows, so Spark can reuse this Python worker
                pass
        if spec.has_data:
            shard_path = os.path.join(workdir, "shard.arrow")
            source = batches if spec.file_split is None else parquet_split.read(spec.file_split, rank)
            rows = _write_shard(source, shard_path)
            if not os.path.exists(shard_path):  # an empty partition: an empty file of no columns
                pa.ipc.new_file(shard_path, pa.schema([])).close()
            go_env[data.SHARD_ENV] = shard_path
        with open(os.path.join(workdir, _rank.FN_FILE), "wb") as fh:
            fh.write(spec.payload)

        def wait_event(name: str, limit: Optional[float]) -> Optional[dict]:
            """The next control event ``name``; None when the process exited or ``limit`` passed."""
            while True:
                if cancel is not None and cancel.is_set():
                    return None
                if proc.poll() is not None and watcher.events.empty():
                    return None
                left = None if limit is None else limit - time.monotonic()
                if left is not None and left <= 0:
                    return None
                try:
                    ev = watcher.events.get(timeout=0.1 if left is None else min(0.1, left))
                except queue.Empty:
                    continue
                if ev.get("event") == name:
                    return ev

        address = _host_address()
        me = json.dumps({"host": address, "port": store_port, "rows": rows, "gpus": gpus})
        peers = [json.loads(m) for m in gang.allgather(me)]
        hosts = [p["host"] for p in peers]
        message: Dict[str, object] = {}
        if spec.backend == "horovod":
            renv = rendezvous.horovod_env(rank, hosts, peers[0]["host"], peers[0]["port"],
                                          _interface_of(address), spec.collective_timeout)
            visible = rendezvous.host_gpus(rank, hosts, [p["gpus"] for p in peers])
            if visible is not None:
                renv["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
                renv[_rank.DEVICE_ENV] = str(visible.index(gpus[0]))
            if rank == 0:
                message["slots"] = rendezvous.horovod_slots(hosts)
        else:
            renv = rendezvous.rank_env(rank, hosts, peers[0]["host"], peers[0]["port"], gpus)
        renv.update(go_env)
        renv[data.SHARD_SIZES_ENV] = json.dumps([p["rows"] for p in peers])
        message["env"] = renv
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

        ev = wait_event("rendezvous", deadline)
        if ev is None and proc.poll() is None and not (cancel is not None and cancel.is_set()):
            _kill_group(proc)
            watcher.join()
            entry = "hvd.init()" if spec.backend == "horovod" else "init_process_group"
            raise fail(f"rank {rank} did not reach the rendezvous ({entry}) within "
                       f"start_timeout={spec.start_timeout}s", None, "rendezvous")
        if client is not None and ev is not None:
            client.send({"type": "rendezvous", "rank": rank})
        while proc.poll() is None:
            if cancel is not None and cancel.wait(0.1):
                if proc.poll() is not None:
                    break  # it ended on its own meanwhile: report what really happened
                _kill_group(proc)
                raise fail(f"rank {rank} was stopped because the run was cancelled", None, "cancelled")
            if cancel is None:
                proc.wait()
        code = proc.returncode
        watcher.join()
        if code != 0:
            raise fail(f"rank {rank} {_exit_text(code)}", code)
        if rank == 0 or spec.return_all:
            path = os.path.join(workdir, _rank.RESULT_FILE)
            size = os.path.getsize(path)
            if size > spec.max_result_bytes:
                raise fail(f"the result of rank {rank} is {size} bytes, more than the driver accepts "
                           f"(spark.driver.maxResultSize = {spec.max_result_bytes} bytes). Write large "
                           "results to storage (e.g. sparkml_dist.collection.ModelStore or torch.save to "
                           "a shared path) and return the path instead.", 0, "result")
            with open(path, "rb") as fh:
                blob = fh.read()
            yield collection.encode_bytes(rank, 0, blob)
        if client is not None:
            client.send({"type": "done", "rank": rank})
    finally:
        if proc is not None:
            _kill_group(proc)
            for pipe in (proc.stdin,):
                try:
                    pipe.close()
                except OSError:
                    pass
        if listener is not None:
            listener.close()
        if client is not None:
            client.close()
        shutil.rmtree(workdir, ignore_errors=True)


def barrier_task(batches: Iterable[pa.RecordBatch], spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """The mapInArrow(barrier=True) function: one rank per partition."""
    yield from supervise(SparkGang(), batches, spec)
