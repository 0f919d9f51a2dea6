"""BarrierRunner: data-parallel training functions on Spark barrier tasks.  [driver]

Check (:mod:`.admission`) -> shard the data (:mod:`.sharding`) -> launch ``np`` barrier tasks or
local processes (:mod:`.launchers`) -> stream the ranks' logs -> return rank 0's result (or every
rank's); on a failure, tell its root cause (:mod:`.failures`) and restart if asked to.

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

import logging
import os
import sys
import time
import uuid
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from .. import _spark_env, collection, tracking
from ..channel import new_secret
from ..channel_server import listen
from ..errors import ConfigurationError, WorkerError
from ..gpus import assign_local, rank_profile
from . import _task, admission, backends, failures, launchers, protocol, sharding
from .launchers import Deadline

log = logging.getLogger(__name__)


class BarrierRunner:
    """Run a training function on ``np`` ranks, each in its own process, gang-scheduled by Spark.

    Args:
        np: ranks. ``np > 0``: that many Spark barrier tasks. ``np < 0``: ``-np`` local processes
            on the driver, no Spark tasks (for debugging; same function, same result).
        backend: "torch" (torch.distributed: gloo on CPU, NCCL on GPU) or "horovod" (the
            function calls ``hvd.init()``; Horovod's Gloo rendezvous is served by rank 0's
            process, no mpirun or ssh; needs Horovod, see ``make horovod``).
        use_gpu: pin each rank to its GPU and use NCCL: on a cluster, the GPU(s) Spark assigned
            to its task; with ``np < 0`` or a local master (``local[N]``, where Spark assigns
            tasks none), one of the driver's GPUs each (``spark.driver.resource.gpu.*``, else
            ``CUDA_VISIBLE_DEVICES``/every device), more ranks than GPUs being an error. With
            "horovod", a rank sees its host's task GPUs in local-rank order, so the usual
            ``torch.cuda.set_device(hvd.local_rank())`` selects the GPU Spark assigned it.
        log_ranks: whose stdout/stderr stream to the driver: "0" (default), "all", "none",
            a rank or a list of ranks. Lines are prefixed with ``[rank r]``.
        start_timeout: seconds for every rank to reach the rendezvous (joining the store, by any
            c10d path: ``init_process_group``, ``init_device_mesh``, ``rpc.init_rpc``...; or
            ``hvd.init()``; or the end of the function); not applied to a single rank, which has
            no peer to wait for; None waits forever. It counts from when the rank gets its start
            message, after its shard is written: streaming a big shard does not count.
        data_timeout: seconds a task's data phase (its shard streaming from Spark, or read from
            Parquet files) may go without a new batch before the run fails naming the shard's
            rank (a stuck fetch, a lost executor); None waits forever. Progress, not total time:
            a large shard that keeps arriving never hits it.
        timeout: wall-clock seconds for the whole run (restarts included); None waits forever.
        collective_timeout: seconds a collective may block (``init_process_group`` default);
            defaults to ``timeout`` or torch's 30 minutes.
        allow_unencrypted: run on a cluster configured for encryption even though collective
            traffic between ranks is not encrypted.
        allow_unauthenticated: run on a cluster with ``spark.authenticate=true`` even though the
            ranks' rendezvous and collective connections are not authenticated (see the README's
            Security section).
        max_restarts: after a rank, task or executor fails, start the run again (a new barrier job
            and rendezvous) up to this many times; the function resumes from the latest checkpoint
            if it loads one. A failure that repeats identically (same rank, exit code and last
            line) stops early; the final error lists every attempt's cause.
        checkpoint_dir: where :mod:`sparkml_dist.runner.checkpoint` saves and loads (a local path or
            an s3://, gs://, hdfs:// URI reachable from every executor).
        model_bytes: memory one rank's model needs (e.g. ``sparkml_dist.plan.model_bytes(net,
            backprop=True, batch_size=64)``); a run whose model cannot fit in an executor's
            Python memory, or with ``use_gpu`` in one GPU (``torch.cuda.mem_get_info`` for ranks
            on this machine, ``spark.sparkml_dist.gpu.memory`` for executors), is refused before
            launching (see :mod:`sparkml_dist.plan`).
        read_files: when ``df`` given to :meth:`run_with_data` is a plain scan of Parquet files
            (``spark.read.parquet(path)``, ``spark.table(t)``, a ``select`` of its columns), each
            task reads its rows straight from the files with pyarrow (contiguous, balanced row
            ranges in file order; see :mod:`sparkml_dist.parquet_split`) instead of Spark
            converting and shuffling them. False always moves rows through Spark (dealt to ranks).
        spark: the SparkSession (default: the active one).
        log_sink: where streamed lines go (default ``sys.stdout.write``: the notebook cell).
        log_dir: also write every rank's whole output (streamed or not) there, one file per rank
            and attempt (``rank<r>-attempt<a>-<run id>.log``); a path every executor can write.
            Whatever ``log_ranks`` says, a Spark task also copies its rank's every line to its
            stderr (Spark UI -> executor logs).
        mlflow: True: log the run as an MLflow run (its settings, wall time, attempts, and what
            rank 0 logs with ``context().log_metrics(step, **metrics)``); None: only when an
            MLflow run is active; False: never.
        work_dir: the directory every rank runs in (created where missing). Default: torchrun's
            rule, ranks on this machine run in the current directory, ranks on other machines in
            ``<tmp>/sparkml_dist-work-<uid>/<script or function>``, one per machine, kept after the
            run (said in the output) so that a second run finds what the first wrote.
        clean_work_dir: remove that default directory on executors once every rank succeeded.
        gpus_per_rank: GPUs each rank holds (with ``use_gpu``), for one-process multi-GPU code: the
            rank then sees its own GPUs as ``cuda:0 ...`` (``context().devices``).
        nodes: what a "node" is for ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` /
            ``NODE_RANK`` and ``CUDA_VISIBLE_DEVICES``: ``"host"`` (torchrun's rule: the ranks of
            one machine; each sees the machine's assigned GPUs in local-rank order, so
            ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` picks its own) or ``"task"``
            (pyspark TorchDistributor's rule: each Spark task is a node, whose ranks see its GPUs).
    """

    def __init__(
        self,
        np: int,
        *,
        backend: str = "torch",
        use_gpu: bool = False,
        log_ranks: Union[str, int, Sequence[int], None] = "0",
        start_timeout: Optional[float] = 180.0,
        data_timeout: Optional[float] = 300.0,
        timeout: Optional[float] = None,
        collective_timeout: Optional[float] = None,
        allow_unencrypted: bool = False,
        allow_unauthenticated: bool = False,
        max_restarts: int = 0,
        checkpoint_dir: Optional[str] = None,
        model_bytes: Optional[int] = None,
        read_files: bool = True,
        spark=None,
        log_sink: Optional[Callable[[str], Any]] = None,
        log_dir: Optional[str] = None,
        mlflow: Optional[bool] = None,
        nodes: str = "host",
        work_dir: Optional[str] = None,
        clean_work_dir: bool = False,
        gpus_per_rank: int = 1,
    ) -> None:
        admission.check_arguments(
            np, start_timeout, timeout, collective_timeout, model_bytes, max_restarts, log_dir, data_timeout
        )
        self._backend = backends.get(backend)
        self._backend.check_installed()
        self.np = np
        self.world_size = abs(np)
        self.backend = backend
        self.use_gpu = bool(use_gpu)
        self.log_ranks = admission.parse_log_ranks(log_ranks, self.world_size)
        self.start_timeout = start_timeout
        self.data_timeout = data_timeout
        self.timeout = timeout
        self.collective_timeout = collective_timeout or timeout or 1800.0
        self.allow_unencrypted = allow_unencrypted
        self.allow_unauthenticated = allow_unauthenticated
        self.read_files = bool(read_files)
        self.model_bytes = model_bytes
        self.checkpoint_dir = checkpoint_dir
        self.log_dir = os.path.abspath(log_dir) if log_dir else None
        self.max_restarts = max_restarts
        self._spark = spark
        self._sink = log_sink or (lambda text: sys.stdout.write(text))
        self._seed = 0
        self._per_task = 1  # ranks per barrier task: one per GPU the task holds
        self._attempt_no = 0  # attempts of the current run, for log file names
        self.mlflow = mlflow
        self.nodes = admission.check_nodes(nodes)
        self.gpus_per_rank = admission.check_gpus_per_rank(gpus_per_rank, self.use_gpu)
        self.work_dir = work_dir
        self.clean_work_dir = bool(clean_work_dir)
        self._job = "function"  # names the kept working directory on executors (the script or function)
        self._track = tracking.NullRun()  # the current run's MLflow run (rank 0's metrics land there)

    # ------------------------------------------------------------------ public API
    def run(self, main: Callable, *args, return_all: bool = False, **kwargs):
        """Run ``main(*args, **kwargs)`` on every rank; rank 0's return value (or all, in rank order)."""
        return self._run(None, main, args, kwargs, return_all)

    def run_with_data(
        self, df, main: Callable, *args, return_all: bool = False, replicas: Optional[int] = None, **kwargs
    ):
        """As :meth:`run`, with each rank's shard of ``df`` available as ``sparkml_dist.runner.shard()``.

        Rows are split into ``np`` disjoint shards: read straight from the files when ``df`` is a
        plain Parquet scan (contiguous row ranges whose sizes differ by at most one row, see
        ``read_files``), else by the shared partitioning layer (rows dealt in the order of a hash of
        their content: sizes differ by at most one row whatever the rows, and the shards do not
        depend on how ``df`` is partitioned).  That is what data parallelism (DDP, FSDP2, Horovod)
        wants: each rank its own rows.

        ``replicas``: for pipelines (``sparkml_dist.parallel.pipeline(..., data_parallel=D)``),
        whose ranks of one replica must all read the *same* rows: the rows are split into D shards
        and the ``np / D`` ranks of replica ``d`` (ranks ``d*np/D ...``, the pipeline's layout) all
        read shard ``d``, in the same order.
        """
        replicas = admission.check_replicas(replicas, self.world_size)
        return self._run(df, main, args, kwargs, return_all, replicas)

    # ------------------------------------------------------------------ running
    def _session(self, df):
        trial = os.environ.get(protocol.IN_TRIAL_ENV)
        if trial is not None and (self.np > 0 or df is not None):
            raise ConfigurationError(
                f"BarrierRunner(np={self.np}){' with a DataFrame' if df is not None else ''} inside Tuner "
                f"trial {trial}: a trial runs in a Spark task, and barrier jobs are started from the "
                "driver's Spark session. Inside a trial use BarrierRunner(np=-k).run(...) (k local "
                "processes on the trial's executor; give the Tuner trial_resources={'cpus': k}), or "
                "tune the BarrierRunner job from the driver one configuration at a time."
            )
        if df is not None:
            return df.sparkSession
        if self.np < 0:
            return None
        return (
            self._spark
            if self._spark is not None
            else _spark_env.active_session(
                "BarrierRunner(np > 0)", "pass spark=..., or use np < 0 to run local processes without Spark"
            )
        )

    def _check_cluster(self, spark, deadline: Deadline) -> None:
        if self.np < 0 and self.use_gpu and self.model_bytes:
            from .. import plan

            per_rank = assign_local(None, self.world_size, True, True, self.gpus_per_rank)
            gpus = [g for rank_gpus in per_rank for g in rank_gpus]  # every GPU a rank will use
            plan.check_fits_gpu(self.model_bytes, plan.gpu_bytes(None, gpus))
        if self.np > 0:
            admission.check_cluster(
                spark,
                self.world_size // self._per_task,  # barrier tasks (a task runs a rank per GPU)
                use_gpu=self.use_gpu,
                allow_unencrypted=self.allow_unencrypted,
                allow_unauthenticated=self.allow_unauthenticated,
                model_bytes=self.model_bytes,
                wait_s=deadline.remaining(self.start_timeout or 60.0),
            )

    def _run(self, df, main, args, kwargs, return_all: bool, replicas: Optional[int] = None):
        settings = {
            "np": self.np,
            "backend": self.backend,
            "use_gpu": self.use_gpu,
            "timeout": self.timeout,
            "max_restarts": self.max_restarts,
            "function": getattr(main, "__qualname__", repr(main)),
            "with_data": df is not None,
        }
        started = time.perf_counter()
        with tracking.job_run("BarrierRunner", self.mlflow, settings) as self._track:
            try:
                return self._run_attempts(df, main, args, kwargs, return_all, replicas)
            finally:
                figures = {"wall_seconds": time.perf_counter() - started, "attempts": self._attempt_no}
                self._track.log_metrics(figures)
                self._track = tracking.NullRun()

    def _run_attempts(self, df, main, args, kwargs, return_all: bool, replicas: Optional[int] = None):
        spark = self._session(df)
        script = getattr(main, "__module__", "") == "sparkml_dist.runner.script" and len(args) > 1
        self._job = str(args[1]) if script else getattr(main, "__qualname__", "function")
        payload = admission.payload(main, args, kwargs)
        self._per_task = admission.ranks_per_task(spark, self.np, self.use_gpu, self.gpus_per_rank)
        deadline = Deadline.after(self.timeout)  # the whole run's: planning, slot wait, restarts
        self._check_cluster(spark, deadline)
        with launchers.within(spark, deadline, "dealing the DataFrame's rows to ranks"):
            files = df is not None and self.read_files
            split = sharding.file_split(df, self.world_size, replicas) if files else None
            data_df = (
                sharding.spark_shards(df, self.world_size, self._seed, self._per_task, replicas)
                if df is not None and split is None
                else None
            )
        tries: List[WorkerError] = []
        self._attempt_no = 0
        while True:
            try:
                if tries:  # a lost executor's replacement may still be starting
                    self._check_cluster(spark, deadline)
                return self._attempt(spark, df is not None, split, data_df, payload, return_all, deadline)
            except WorkerError as exc:
                tries.append(exc)
                stop = failures.restart_verdict(tries, self.max_restarts)
                if stop and len(tries) == 1:
                    raise
                if stop:
                    raise failures.final_error(tries, stop) from exc
                cause = failures.cause(exc)
                log.warning(
                    "run attempt %d failed (%s); restart %d of %d",
                    len(tries),
                    cause,
                    len(tries),
                    self.max_restarts,
                )
                self._sink(
                    f"[sparkml_dist] attempt {len(tries)} failed: {cause}; restarting "
                    f"({len(tries)} of {self.max_restarts}) with a fresh rendezvous\n"
                )

    def _task_spec(
        self,
        spark,
        run_id: str,
        channel: Tuple[str, int],
        secret: bytes,
        payload: bytes,
        has_data: bool,
        split,
        return_all: bool,
    ) -> _task.TaskSpec:
        env = ()
        if self.checkpoint_dir:
            from .protocol import CHECKPOINT_DIR_ENV

            d = self.checkpoint_dir
            env = ((CHECKPOINT_DIR_ENV, d if "://" in d else os.path.abspath(d)),)
        return _task.TaskSpec(
            run_id=run_id,
            world_size=self.world_size,
            payload=payload,
            backend=self.backend,
            use_gpu=self.use_gpu,
            log_ranks=self.log_ranks,
            channel=channel,
            secret=secret,
            start_timeout=self.start_timeout,
            data_timeout=self.data_timeout,
            collective_timeout=float(self.collective_timeout),
            has_data=has_data,
            file_split=split,
            return_all=return_all,
            env=env,
            max_result_bytes=_spark_env.max_result_bytes(spark),
            local_gpus=assign_local(spark, self.world_size, self.use_gpu, self.np < 0, self.gpus_per_rank),
            gpus_per_rank=self.gpus_per_rank,
            ranks_per_task=self._per_task,
            log_dir=self.log_dir,
            attempt=self._attempt_no,
            nodes=self.nodes,
            launch=(_spark_env.driver_host(spark), os.getcwd()),
            work_dir=self.work_dir,
            clean_work_dir=self.clean_work_dir,
            job=self._job,
            # on a local master a task's stderr is the driver's console, which already shows the
            # streamed lines: copying them there too would print each line twice
            echo=spark is not None and not _spark_env.is_local(_spark_env.master_of(spark)),
        )

    def _attempt(
        self, spark, has_data: bool, split, data_df, payload: bytes, return_all: bool, deadline: Deadline
    ):
        """One launch: a fresh run id, log channel and rendezvous."""
        run_id = uuid.uuid4().hex[:12]
        self._attempt_no += 1
        tasks = self.world_size // self._per_task
        monitor = failures.Monitor(self.world_size, self._sink, self._backend, tasks)
        monitor.on_metrics = self._track.log_metrics
        secret = new_secret()
        host = _spark_env.driver_host(spark)
        server = listen(secret, monitor.on_message, host)
        try:
            spec = self._task_spec(
                spark, run_id, (host, server.port), secret, payload, has_data, split, return_all
            )
            if self.np > 0:
                profile = rank_profile(spark, self.use_gpu, self.gpus_per_rank)
                table = launchers.launch_spark(spark, data_df, spec, monitor, deadline, profile)
            else:
                table = launchers.launch_local(data_df, spec, monitor, deadline)
            results = collection.decode(table, range(self.world_size) if return_all else [0], what="rank")
        finally:
            server.close()
        if return_all:
            return [results[(r, 0)] for r in range(self.world_size)]
        return results[(0, 0)]
