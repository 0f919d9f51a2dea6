"""BarrierRunner: data-parallel training functions on Spark barrier tasks.  [driver]

Validate -> plan (shards, slots, encryption) -> launch ``np`` barrier tasks with
``mapInArrow(barrier=True)`` -> stream the ranks' logs -> return rank 0's result (or every rank's).

Example::

    from sparkml_dist.runner import BarrierRunner, init_process_group, shard

    def train(epochs):
        import torch
        init_process_group()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(50, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(epochs):
            for X, y in shard().dataloader(256, ["features", "label"]):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(X), y).backward()
                opt.step()
        return model.module.state_dict()

    state = BarrierRunner(np=2).run_with_data(df, train, epochs=3)
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from .. import collection, launch, parquet_split, partitioning, plan, serialization
from ..errors import (ConfigurationError, InsufficientResourcesError, RunTimeoutError,
                      SparkMLDistError, WorkerError)
from . import _task, rendezvous
from .channel import LogServer, new_secret

log = logging.getLogger(__name__)

BACKENDS = ("torch", "horovod")
FAILURE_GRACE_S = 1.0  # after a first failure report, how long to wait for the others
# a rank failing with one of these only noticed that another rank went away: a symptom
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "NCCL communicator was aborted", "ProcessGroupNCCL is aborted",
              "Horovod has been shut down")  # Horovod's words for a peer that failed or left
_SLOT_ERROR = "requires more slots than the total number of slots"


def _cause(exc: WorkerError) -> str:
    """One line for an attempt: what happened, and the last line the rank printed."""
    first = str(exc).splitlines()[0]
    last = _signature(exc)[2]
    return first if last in first else f"{first} [{last}]"


def _signature(exc: WorkerError) -> tuple:
    """What makes two failures 'the same': rank, exit code and the last line the rank printed."""
    lines = [ln.strip() for ln in (exc.worker_traceback or "").splitlines() if ln.strip()]
    return exc.rank, exc.exit_code, lines[-1] if lines else str(exc).splitlines()[0]


def registered_slots(spark) -> Optional[int]:
    """Task slots of the executors registered now (classic Spark; None without JVM access)."""
    try:
        sc = spark.sparkContext._jsc.sc()
        return int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # Spark Connect: no JVM to ask
        return None


def _parse_log_ranks(value, world: int) -> tuple:
    if value is None or value == "none":
        return ()
    if value == "all":
        return tuple(range(world))
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        try:
            return tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            pass
    elif isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    raise ConfigurationError(f"log_ranks must be 'all', 'none', a rank or a list of ranks; got {value!r}")


def _unpicklable_part(fn: Callable) -> str:
    """Name what a function captures that cannot be pickled (closure cells, then globals)."""
    code = getattr(fn, "__code__", None)
    candidates = []
    if code is not None and getattr(fn, "__closure__", None):
        candidates += list(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__)))
    if code is not None:
        g = getattr(fn, "__globals__", {})
        candidates += [(n, g[n]) for n in code.co_names if n in g and not isinstance(g[n], type(sys))]
    for name, value in candidates:
        try:
            serialization.dumps(value)
        except Exception as exc:  # the first capture that cannot travel
            return f" It captures {name!r} ({type(value).__module__}.{type(value).__qualname__}), " \
                   f"which cannot be pickled: {exc}. Create it inside the function instead."
    return ""


class BarrierRunner:
    """Run a training function on ``np`` ranks, each in its own process, gang-scheduled by Spark.

    Args:
        np: ranks. ``np > 0``: that many Spark barrier tasks. ``np < 0``: ``-np`` local processes
            on the driver, no Spark tasks (for debugging; same function, same result).
        backend: "torch" (torch.distributed: gloo on CPU, NCCL on GPU) or "horovod" (the
            function calls ``hvd.init()``; Horovod's Gloo rendezvous is served by rank 0's
            process, no mpirun or ssh; needs Horovod, see ``make horovod``).
        use_gpu: pin each rank to the GPU(s) Spark assigned to its task and use NCCL. With
            "horovod", a rank sees its host's task GPUs in local-rank order, so the usual
            ``torch.cuda.set_device(hvd.local_rank())`` selects the GPU Spark assigned it.
        log_ranks: whose stdout/stderr stream to the driver: "0" (default), "all", "none",
            a rank or a list of ranks. Lines are prefixed with ``[rank r]``.
        start_timeout: seconds for every rank to reach the rendezvous (its call of
            ``init_process_group`` or ``hvd.init()``, or the end of the function); None waits forever.
        timeout: wall-clock seconds for the whole run (restarts included); None waits forever.
        collective_timeout: seconds a collective may block (``init_process_group`` default);
            defaults to ``timeout`` or torch's 30 minutes.
        allow_unencrypted: run on a cluster configured for encryption even though collective
            traffic between ranks is not encrypted.
        max_restarts: after a rank, task or executor fails, start the run again (a new barrier job
            and rendezvous) up to this many times; the function resumes from the latest checkpoint
            if it loads one. A failure that repeats identically (same rank, exit code and last
            line) stops early; the final error lists every attempt's cause.
        checkpoint_dir: where :mod:`sparkml_dist.runner.checkpoint` saves and loads (a local path or
            an s3://, gs://, hdfs:// URI reachable from every executor).
        model_bytes: memory one rank's model needs (e.g. ``sparkml_dist.plan.model_bytes(net,
            backprop=True, batch_size=64)``); a run whose model cannot fit in an executor's
            Python memory is refused before launching (see :mod:`sparkml_dist.plan`).
        read_files: when ``df`` given to :meth:`run_with_data` is a plain scan of Parquet files
            (``spark.read.parquet(path)``, ``spark.table(t)``, a ``select`` of its columns), each
            task reads its rows straight from the files with pyarrow (contiguous, balanced row
            ranges in file order; see :mod:`sparkml_dist.parquet_split`) instead of Spark
            converting and shuffling them. False always moves rows through Spark (hashed to ranks).
        spark: the SparkSession (default: the active one).
        log_sink: where streamed lines go (default ``sys.stdout.write``: the notebook cell).
    """

    def __init__(self, np: int, *, backend: str = "torch", use_gpu: bool = False,
                 log_ranks: Union[str, int, Sequence[int], None] = "0",
                 start_timeout: Optional[float] = 180.0, timeout: Optional[float] = None,
                 collective_timeout: Optional[float] = None, allow_unencrypted: bool = False,
                 max_restarts: int = 0, checkpoint_dir: Optional[str] = None,
                 model_bytes: Optional[int] = None, read_files: bool = True, spark=None,
                 log_sink: Optional[Callable[[str], Any]] = None) -> None:
        if not isinstance(np, int) or isinstance(np, bool) or np == 0:
            raise ConfigurationError(f"np must be a non-zero integer (np > 0: Spark barrier tasks, "
                                     f"np < 0: local processes on the driver); got {np!r}")
        if backend not in BACKENDS:
            raise ConfigurationError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "horovod" and importlib.util.find_spec("horovod") is None:
            from ._horovod import INSTALL_HINT

            raise ConfigurationError(f"backend='horovod' needs Horovod, which is not installed in this "
                                     f"Python ({sys.executable}). {INSTALL_HINT}")
        for name, value in (("start_timeout", start_timeout), ("timeout", timeout),
                            ("collective_timeout", collective_timeout)):
            if value is not None and not value > 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds or None, got {value!r}")
        self.np = np
        self.world_size = abs(np)
        self.backend = backend
        self.use_gpu = bool(use_gpu)
        self.log_ranks = _parse_log_ranks(log_ranks, self.world_size)
        self.start_timeout = start_timeout
        self.timeout = timeout
        self.collective_timeout = collective_timeout or timeout or 1800.0
        self.allow_unencrypted = allow_unencrypted
        self.read_files = bool(read_files)
        if model_bytes is not None and (not isinstance(model_bytes, int) or model_bytes < 0):
            raise ConfigurationError(f"model_bytes must be a number of bytes >= 0 or None, got {model_bytes!r}")
        self.model_bytes = model_bytes
        self.checkpoint_dir = checkpoint_dir
        if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
            raise ConfigurationError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
        self.max_restarts = max_restarts
        self._local = threading.local()  # per-run state of runs started from several threads
        self._spark = spark
        self._sink = log_sink or (lambda text: sys.stdout.write(text))
        self._seed = 0

    # ------------------------------------------------------------------ public API
    def run(self, main: Callable, *args, return_all: bool = False, **kwargs):
        """Run ``main(*args, **kwargs)`` on every rank; rank 0's return value (or all, in rank order)."""
        return self._run(None, main, args, kwargs, return_all)

    def run_with_data(self, df, main: Callable, *args, return_all: bool = False, **kwargs):
        """As :meth:`run`, with each rank's shard of ``df`` available as ``sparkml_dist.runner.shard()``.

        Rows are split into ``np`` disjoint shards: read straight from the files when ``df`` is a
        plain Parquet scan (contiguous row ranges whose sizes differ by at most one row, see
        ``read_files``), else by the shared partitioning layer (a hash of each row, so shards do
        not depend on how ``df`` is partitioned).
        """
        return self._run(df, main, args, kwargs, return_all)

    # ------------------------------------------------------------------ planning
    def _session(self, df):
        if df is not None:
            return df.sparkSession
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        try:  # the thread's active session, else the default one (runs started from other threads)
            return SparkSession.active()
        except Exception:
            raise ConfigurationError("no active SparkSession: create one first, or pass spark=..., or "
                                     "use np < 0 to run local processes without Spark") from None

    def _payload(self, main: Callable, args, kwargs, want_result: bool) -> bytes:
        if not callable(main):
            raise ConfigurationError(f"main must be callable, got {type(main).__name__}")
        try:
            return serialization.dumps((main, args, kwargs, want_result))
        except Exception as exc:
            raise ConfigurationError(
                f"cannot send {getattr(main, '__name__', main)!r} and its arguments to the ranks: "
                f"{type(exc).__name__}: {exc}.{_unpicklable_part(main)}") from None

    def _check_cluster(self, spark) -> None:
        conf = lambda k, d=None: spark.conf.get(k, d)  # noqa: E731
        warning = rendezvous.check_encryption(conf, self.allow_unencrypted)
        if warning:
            log.warning("%s", warning)
        master = conf("spark.master", "") or ""
        if self.model_bytes:
            plan.plan_concurrency(spark, self.model_bytes)  # raises when one model cannot fit a worker
        live = self._live_slots(spark, master, conf)
        rendezvous.check_slots(self.world_size, master, conf, live)
        if self.use_gpu and not rendezvous.schedules_gpus(conf):
            raise InsufficientResourcesError(
                "use_gpu=True but this cluster schedules no GPUs: set spark.executor.resource.gpu.amount, "
                "spark.task.resource.gpu.amount and spark.executor.resource.gpu.discoveryScript "
                "(spark.driver.resource.gpu.* in local mode), or use use_gpu=False.")

    def _live_slots(self, spark, master: str, conf) -> Optional[int]:
        """Task slots of the executors registered now (classic Spark only; None if unknown).

        Executors of a cluster that has just started register over some seconds: wait for enough
        of them (up to ``start_timeout``) rather than fail the first run on a fresh cluster.
        """
        if launch.is_connect(spark) or (master.startswith("local") and not master.startswith("local-cluster")):
            return None
        deadline = time.monotonic() + (self.start_timeout or 60.0)
        while True:
            slots = registered_slots(spark)
            if slots is None or slots >= self.world_size or time.monotonic() > deadline:
                return slots  # None: no JVM access, Spark's own barrier check decides
            time.sleep(0.5)

    def _rank_env(self) -> tuple:
        from .checkpoint import DIR_ENV

        if not self.checkpoint_dir:
            return ()
        d = self.checkpoint_dir
        return ((DIR_ENV, d if "://" in d else os.path.abspath(d)),)

    def _file_split(self, df) -> Optional[parquet_split.ParquetSplit]:
        """Each rank's row ranges of ``df``'s Parquet files, or None to move the rows through Spark."""
        if not self.read_files:
            return None
        split, why = parquet_split.plan(df, self.world_size)
        if split is None:
            log.info("run_with_data: the rows go through Spark, not straight from files: %s", why)
            return None
        if split.num_rows < self.world_size:
            raise ConfigurationError(f"the DataFrame has {split.num_rows} rows, fewer than np="
                                     f"{self.world_size} ranks; every rank needs at least one row.")
        log.info("run_with_data: %d ranks read %d rows straight from %d Parquet files", self.world_size,
                 split.num_rows, len({s.uri for part in split.parts for s in part}))
        return split

    def _shards(self, df):
        """``df`` as ``np`` partitions, partition r holding rank r's shard (lazy but for one cheap check).

        Rows are hashed to ranks (shared partitioning layer, disjoint), which needs no pass over the
        data; an input too small for hashing to fill every rank (fewer than 64 rows per rank) is
        dealt round-robin instead. The ranks exchange their row counts at the rendezvous.
        """
        cols = df.columns
        small = 64 * self.world_size
        n = df.limit(small).count()
        if n < self.world_size:
            raise ConfigurationError(f"the DataFrame has {n} rows, fewer than np={self.world_size} "
                                     "ranks; every rank needs at least one row.")
        if n < small:
            grouped = partitioning.deal_groups(df, self.world_size, self._seed, cols)
        else:
            spec = partitioning.SplitSpec(num_groups=self.world_size, seed=self._seed,
                                          names={"num_groups": "np"})
            grouped = partitioning.assign_groups(df, spec, cols)
        return grouped.select(*cols)

    def _max_result_bytes(self, spark) -> int:
        text = (spark.conf.get("spark.driver.maxResultSize", "1g") or "1g") if spark is not None else "1g"
        limit = partitioning.parse_bytes(text)
        return limit - (1 << 20) if limit > 0 else 1 << 62  # room for chunk row overhead

    # ------------------------------------------------------------------ running
    def _run(self, df, main, args, kwargs, return_all: bool):
        spark = None if self.np < 0 and df is None else self._session(df)
        payload = self._payload(main, args, kwargs, True)
        if self.np > 0:
            self._check_cluster(spark)
        self._local.deadline = time.monotonic() + self.timeout if self.timeout else None
        split = self._file_split(df) if df is not None else None
        data_df = self._shards(df) if df is not None and split is None else None
        failures: List[WorkerError] = []
        while True:
            try:
                if failures and self.np > 0:  # a lost executor's replacement may still be starting
                    self._check_cluster(spark)
                return self._attempt(spark, df is not None, split, data_df, payload, return_all)
            except WorkerError as exc:
                failures.append(exc)
                stop = self._restart_verdict(failures)
                if stop and len(failures) == 1:
                    raise
                if stop:
                    raise self._final_error(failures, stop) from exc
                cause = _cause(exc)
                log.warning("run attempt %d failed (%s); restart %d of %d", len(failures), cause,
                            len(failures), self.max_restarts)
                self._sink(f"[sparkml_dist] attempt {len(failures)} failed: {cause}; restarting "
                           f"({len(failures)} of {self.max_restarts}) with a fresh rendezvous\n")

    def _restart_verdict(self, failures: List[WorkerError]) -> str:
        """Why to stop restarting now ('' to go on)."""
        if len(failures) > self.max_restarts:
            return f"max_restarts={self.max_restarts} used up"
        if len(failures) >= 2 and _signature(failures[-1]) == _signature(failures[-2]):
            return "the same failure repeated identically (a bug in the function, not a lost machine)"
        return ""

    def _final_error(self, failures: List[WorkerError], why: str) -> WorkerError:
        last = failures[-1]
        lines = "; ".join(f"attempt {i + 1}: {_cause(f)}" for i, f in enumerate(failures))
        return WorkerError(f"the run failed {len(failures)} times, restarts stopped ({why}): {lines}",
                           rank=last.rank, exit_code=last.exit_code, worker_traceback=last.worker_traceback)

    def _attempt(self, spark, has_data: bool, split, data_df, payload: bytes, return_all: bool):
        """One launch: a fresh run id, log channel and rendezvous."""
        run_id = uuid.uuid4().hex[:12]
        monitor = _Monitor(self.world_size, self._sink, self.backend)
        secret = new_secret()
        server = LogServer(secret, monitor.on_message)
        try:
            host = self._driver_host(spark)
            spec = _task.TaskSpec(
                run_id=run_id, world_size=self.world_size, payload=payload, backend=self.backend,
                use_gpu=self.use_gpu, log_ranks=self.log_ranks, channel=(host, server.port),
                secret=secret, start_timeout=self.start_timeout,
                collective_timeout=float(self.collective_timeout), has_data=has_data,
                file_split=split, return_all=return_all, env=self._rank_env(),
                max_result_bytes=self._max_result_bytes(spark))
            expected = range(self.world_size) if return_all else [0]
            if self.np > 0:
                table = self._launch_spark(spark, data_df, spec, monitor)
            else:
                table = self._launch_local(data_df, spec, monitor)
            results = collection.decode(table, expected, what="rank")
        finally:
            server.close()
        if return_all:
            return [results[(r, 0)] for r in range(self.world_size)]
        return results[(0, 0)]

    @staticmethod
    def _driver_host(spark) -> str:
        if spark is not None and not launch.is_connect(spark):
            host = spark.conf.get("spark.driver.host", None)
            if host:
                return host
        return _task._host_address()

    def _wait(self, done: threading.Event, monitor: "_Monitor", cancel: Callable[[], None],
              errors: List[BaseException]) -> None:
        """Wait for the job, a reported failure, the timeout or Ctrl-C; cancel on anything but success."""
        deadline = getattr(self._local, "deadline", None)  # the whole run's, restarts included
        try:
            while not done.wait(0.1):
                if monitor.failure is not None:
                    monitor.wait_for_reports(FAILURE_GRACE_S)
                    cancel()
                    done.wait(30)
                    raise monitor.worker_error()
                if deadline is not None and time.monotonic() > deadline:
                    cancel()
                    done.wait(30)
                    raise RunTimeoutError(
                        f"the run exceeded timeout={self.timeout}s; its Spark job was cancelled and "
                        f"every rank stopped. Ranks that reached the rendezvous: {sorted(monitor.reached)}.")
        except KeyboardInterrupt:
            cancel()
            done.wait(30)
            raise
        if monitor.failure is not None:
            raise monitor.worker_error()
        if errors:
            raise self._translate(errors[0], monitor)

    def _translate(self, exc: BaseException, monitor: "_Monitor") -> BaseException:
        text = str(exc)
        detail = _task.parse_failure(text)
        if detail is not None:
            monitor.add_failure(detail)
            return monitor.worker_error()
        if _SLOT_ERROR in text or "barrier stage that requires more slots" in text:
            spark_line = next((ln.strip() for ln in text.splitlines() if "slots" in ln), "")
            return InsufficientResourcesError(
                f"np={self.world_size} barrier tasks need {self.world_size} free task slots at once and "
                f"the cluster has fewer (Spark: {spark_line[:300]}). Lower np or add executors.")
        if isinstance(exc, SparkMLDistError):
            return exc
        return WorkerError(f"the barrier job failed: {type(exc).__name__}: {text.splitlines()[0][:500] if text else ''}",
                           worker_traceback=text[-5000:])

    def _gpu_profile(self, spark):
        """A stage-level profile asking one GPU per task, when the cluster does not set one.

        With ``spark.task.resource.gpu.amount`` set, Spark already gives each task its GPUs.
        Otherwise (executors have GPUs, tasks request none by default) this stage asks for one.
        """
        if not self.use_gpu or spark.conf.get("spark.task.resource.gpu.amount", None):
            return None
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        cpus = int(spark.conf.get("spark.task.cpus", "1") or 1)
        return ResourceProfileBuilder().require(TaskResourceRequests().cpus(cpus).resource("gpu", 1)).build

    def _launch_spark(self, spark, data_df, spec: _task.TaskSpec, monitor: "_Monitor"):
        df = data_df if data_df is not None else spark.range(0, self.world_size, 1, self.world_size)
        out = launch.map_groups(df, _task.barrier_task, spec, barrier=True, catch_errors=False,
                                profile=self._gpu_profile(spark))
        tag = f"sparkml_dist-run-{spec.run_id}"
        done, box, errors = threading.Event(), [], []

        def job():
            try:
                spark.addTag(tag)
                box.append(out.toArrow())
            except BaseException as exc:  # reported to the waiting thread
                errors.append(exc)
            finally:
                with contextlib.suppress(Exception):
                    spark.removeTag(tag)
                done.set()

        threading.Thread(target=job, name=f"sparkml_dist-{spec.run_id}", daemon=True).start()
        self._wait(done, monitor, lambda: spark.interruptTag(tag), errors)
        return box[0]

    def _launch_local(self, data_df, spec: _task.TaskSpec, monitor: "_Monitor"):
        import pyarrow as pa

        gang = _task.ThreadGang(self.world_size)
        shards: List[list] = [[] for _ in range(self.world_size)]
        if data_df is not None:
            from pyspark.sql import functions as F

            table = data_df.withColumn("__sd_rank", F.spark_partition_id()).toArrow()
            ranks = table.column("__sd_rank").to_numpy()
            table = table.drop_columns(["__sd_rank"])
            for r in range(self.world_size):
                shards[r] = table.filter(pa.array(ranks == r)).to_batches()
        done, errors, outputs = threading.Event(), [], [[] for _ in range(self.world_size)]
        cancel_event = threading.Event()

        def rank_thread(r: int) -> None:
            member = gang.member(r)
            try:
                for batch in _task.supervise(member, iter(shards[r]), spec, cancel=cancel_event):
                    outputs[r].append(batch)
            except BaseException as exc:
                errors.append(exc)
                member.abort()  # ranks still waiting at the gang rendezvous stop now
                # ranks already running get the same grace as the driver's reports: the first
                # failure seen may be a symptom of another rank's failure that is still exiting
                threading.Timer(FAILURE_GRACE_S, cancel_event.set).start()

        threads = [threading.Thread(target=rank_thread, args=(r,), daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()

        def joiner():
            for t in threads:
                t.join()
            done.set()

        threading.Thread(target=joiner, daemon=True).start()

        def cancel():
            cancel_event.set()

        self._wait(done, monitor, cancel, errors)
        batches = [b for out in outputs for b in out]
        return pa.Table.from_batches(batches, schema=collection.CHUNK_SCHEMA)


class _Monitor:
    """Driver-side view of the run, fed by the log channel."""

    def __init__(self, world_size: int, sink: Callable[[str], Any], backend: str = "torch") -> None:
        self.world_size = world_size
        self.backend = backend
        self._sink = sink
        self._lock = threading.Lock()
        self.reached: set = set()
        self.finished: set = set()
        self.failures: List[dict] = []
        self._first_failure_at: Optional[float] = None

    @property
    def failure(self) -> Optional[dict]:
        return self.failures[0] if self.failures else None

    def add_failure(self, detail: dict) -> None:
        with self._lock:
            if all(f.get("rank") != detail.get("rank") for f in self.failures):
                self.failures.append(detail)
                if self._first_failure_at is None:
                    self._first_failure_at = time.monotonic()

    def wait_for_reports(self, grace: float) -> None:
        """Give the other ranks ``grace`` seconds to report, so the root cause can be picked."""
        while self._first_failure_at is not None and time.monotonic() < self._first_failure_at + grace:
            if len(self.failures) + len(self.finished) >= self.world_size:
                return
            time.sleep(0.05)

    def on_message(self, msg: Dict[str, Any]) -> None:
        kind, rank = msg.get("type"), msg.get("rank")
        if kind == "line":
            with self._lock:
                self._sink(f"[rank {rank}] {msg.get('text', '')}\n")
        elif kind == "rendezvous":
            self.reached.add(rank)
        elif kind == "done":
            self.finished.add(rank)
        elif kind == "failed":
            self.add_failure(msg)

    def root_cause(self) -> dict:
        """The failure that caused the others: not a lost-peer symptom, then the earliest."""
        def symptom(f: dict) -> bool:
            return any(p in line for line in (f.get("tail") or [])[-5:] for p in _PEER_LOST)

        return min(self.failures, key=lambda f: (f.get("phase") == "cancelled", symptom(f),
                                                 f.get("failed_at", float("inf"))))

    def worker_error(self) -> WorkerError:
        d = self.root_cause() if self.failures else {}
        rank = d.get("rank")
        message = d.get("message", "a rank failed")
        if d.get("phase") in ("rendezvous", "start"):
            time.sleep(0.5)  # let the other ranks' start-timeout reports arrive
            missing = sorted(set(range(self.world_size)) - self.reached)
            if missing:
                entry = "hvd.init()" if self.backend == "horovod" else "init_process_group"
                message = (f"ranks {missing} did not reach the rendezvous ({entry}) within "
                           f"start_timeout; {message}")
        others = [f for f in self.failures if f is not d]
        if others:
            message += "; then " + ", ".join(f"rank {f['rank']} ({f['message'].split(' ', 2)[-1]})"
                                             for f in sorted(others, key=lambda f: f["rank"]))
        if self.finished:
            message += f" (ranks {sorted(self.finished)} had already finished)"
        tail = "\n".join(d.get("tail") or [])
        return WorkerError(message, rank=rank, exit_code=d.get("exit_code"), worker_traceback=tail)
