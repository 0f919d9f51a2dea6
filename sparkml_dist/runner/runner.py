"""BarrierRunner: data-parallel training functions on Spark barrier tasks.  [driver]

The runner holds configuration only; each call builds a :class:`~sparkml_dist.runner.run.Run`
(check, shard the data, launch ``np`` barrier tasks or local processes, stream the ranks' logs,
return rank 0's result or every rank's; on a failure, its root cause and a restart if asked to).

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
import sys
from typing import Any, Callable, Optional, Sequence, Union

from .. import arg_checks
from . import admission, backends, comm_settings, launchers, settings, sizing
from . import roles as roles_
from .data.sample_order import check_streams
from .elastic import executor_loss as executor_loss_
from .run import Run

log = logging.getLogger(__name__)


def _resolved_np(np, spark, use_gpu: bool, gpus_per_rank) -> Any:
    """``np="auto"``: every GPU with ``use_gpu``, else every task slot; any other value as given."""
    if np != "auto":
        return np
    from .. import _spark_env

    session = spark or _spark_env.active_session('BarrierRunner(np="auto")', "pass spark=...")
    return sizing.auto_np(session, use_gpu, gpus_per_rank if isinstance(gpus_per_rank, int) else 1)


class BarrierRunner:
    """Run a training function on ``np`` ranks, each in its own process, gang-scheduled by Spark.

    Args:
        np: ranks. ``np > 0``: that many Spark barrier tasks. ``np < 0``: ``-np`` local processes
            on the driver, no Spark tasks (for debugging; same function, same result).
            ``"auto"``: one rank per GPU with ``use_gpu`` (the driver's on a local master, the
            tasks' on a cluster), else one per task slot.
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
        collective_timeout: seconds a collective may block (``init_process_group`` default):
            a rank that stops answering fails the run after this long instead of hanging its
            peers. Default 600 (10 minutes, NCCL's own default; torch's gloo default is 30), or
            ``timeout`` when that is shorter; raise it for steps that legitimately keep some ranks
            waiting longer (a long evaluation on rank 0 while the others wait at a barrier).
        allow_unencrypted: run on a cluster configured for encryption even though collective
            traffic between ranks is not encrypted.
        allow_unauthenticated: run on a cluster with ``spark.authenticate=true`` even though the
            ranks' rendezvous and collective connections are not authenticated (see
            docs/security.md).
        max_restarts: after a rank, task or executor fails, start the run again (a new barrier job
            and rendezvous) up to this many times; the function resumes from the latest checkpoint
            if it loads one. A failure that repeats identically (same rank, exit code and last
            line) stops early, unless a machine was lost or the rank was killed from outside
            (SIGKILL, SIGTERM); the final error lists every attempt's cause.
        checkpoint_dir: where :mod:`sparkml_dist.runner.checkpoint` saves and loads (a local path or
            an s3://, gs://, hdfs:// URI reachable from every executor).
        model_bytes: memory one rank's model needs (e.g. ``sparkml_dist.plan.model_bytes(net,
            backprop=True, batch_size=64)``); a run whose model cannot fit in an executor's
            Python memory, or with ``use_gpu`` in one GPU (``torch.cuda.mem_get_info`` for ranks
            on this machine, ``spark.sparkml_dist.gpu.memory`` for executors), is refused before
            launching (see :mod:`sparkml_dist.plan`).
        read_files: the ranks read :meth:`run_with_data`'s rows from Parquet files with pyarrow
            (contiguous row ranges whose sizes differ by at most one row, in file order; see
            :mod:`sparkml_dist.runner.data.parquet_split`): a plain Parquet scan's own files
            (``spark.read.parquet(path)``, ``spark.table(t)``, a ``select`` of its columns), any
            other DataFrame's rows written once as Parquet under ``staging_dir`` (one Spark job, no
            shuffle; see :mod:`sparkml_dist.runner.data.staging`). False deals the rows through Spark
            by a hash of their content (a counting job, one shuffle): the same shards whatever
            the input's partitioning, and the DataFrame is never written.
        staging_dir: where a DataFrame that is not a plain Parquet scan is written for the ranks
            (removed after the run): default ``spark.sparkml_dist.stagingDir``, else this
            machine's temporary directory when every rank runs here (``local[N]``,
            ``local-cluster``, ``np < 0``); on another cluster with neither, rows are dealt
            through Spark; False: never (the exact deal, for results that must not depend on
            how ``df`` is partitioned). A path every executor writes and the driver reads (``s3://``,
            ``hdfs://``, a shared mount such as ``/dbfs/tmp``).
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
        warm_ranks: fork each rank (torch, TensorFlow, JAX) from a process on its executor that
            imported the framework once, started by the first run and kept between runs of the
            application (:mod:`.tasks.warm_pool`: later runs reach their first step in a fraction
            of a second). Code that runs at an interpreter's start (``sitecustomize``, ``.pth``
            files) then runs once in that process, not in each rank. False, or
            ``SPARKML_DIST_WARM_RANKS=0``: every rank a new interpreter.
        gpus_per_rank: GPUs each rank holds (with ``use_gpu``), for one-process multi-GPU code: the
            rank then sees its own GPUs as ``cuda:0 ...`` (``context().devices``).
        nodes: what a "node" is for ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` /
            ``NODE_RANK`` and ``CUDA_VISIBLE_DEVICES``: ``"host"`` (torchrun's rule: the ranks of
            one machine; each sees the machine's assigned GPUs in local-rank order, so
            ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` picks its own) or ``"task"``
            (pyspark TorchDistributor's rule: each Spark task is a node, whose ranks see its GPUs).
        env: environment variables for every rank, on every attempt (``{"NCCL_SOCKET_IFNAME": "eth0"}``,
            a cloud credential the function needs); the names the runner sets itself (``RANK``,
            ``MASTER_ADDR``, ``CUDA_VISIBLE_DEVICES``, ...) are refused by name, and values whose
            names look secret are never logged. An active MLflow run's tracking URI, credentials and
            run id reach the ranks the same way, so ``mlflow.log_metric`` in a rank lands in the
            job's run.
        comm: communication settings for every rank (``{"bucket_cap_mb": 100, "compression":
            "fp16", "accumulate": 4}``): the defaults of ``sparkml_dist.parallel.comm.ddp`` (torch)
            and ``comm.horovod`` in the ranks, Horovod's fusion threshold and cycle time set before
            it starts; a name the backend has no meaning for is refused naming it. See
            :mod:`sparkml_dist.runner.comm_settings`.
        min_np: elastic restarts (with ``max_restarts``): after a failure, the next attempt starts
            with as many ranks as the cluster holds slots for now, between ``min_np`` and ``np``,
            instead of waiting for ``np`` (a lost host no longer blocks the run); a later restart
            grows back. The function sees the new ``WORLD_SIZE``, ``run_with_data`` deals the rows
            again, the checkpoint resumes. See :mod:`sparkml_dist.runner.sizing`.
        roles: with ``backend="tensorflow"``, TensorFlow's parameter-server topology
            (``tf.distribute.ParameterServerStrategy``): ``{"ps": p}`` (and ``"chief": 1``, the
            default) adds a chief and ``p`` parameter servers to the ``np`` workers, ``1 + np + p``
            tasks in all. The function runs on the chief only (rank 0: its result is the run's),
            and its ``TF_CONFIG`` names every role; the workers and parameter servers run a
            ``tf.distribute.Server`` until the chief's function returns. A lost worker's work goes
            to the other workers; a lost parameter server fails the run naming it. See
            :mod:`sparkml_dist.runner.roles`.
        executor_loss: what a lost executor costs. ``"restart"`` (default): the ranks are one
            Spark barrier stage, which ends when an executor is lost; every rank restarts from the
            latest checkpoint (``max_restarts``). ``"replace"``: the ranks are plain Spark tasks;
            Spark runs only the lost executor's task again, and inside
            :func:`sparkml_dist.runner.elastic.run` its new rank joins the others, which keep their
            processes (``backend="torch"``, ``max_restarts >= 1``, rows from files, not rank 0's
            executor; see :mod:`sparkml_dist.runner.elastic.executor_loss`). With ``min_np`` too,
            the world shrinks and grows in place: when a lost executor's ranks are not back within
            ``resize_wait``, the others go on as a smaller group (at least ``min_np`` ranks), and
            the ranks that come back later join at the next commit.
        resize_wait: with ``executor_loss="replace"`` and ``min_np``: the seconds the survivors
            wait for a lost executor's ranks before they go on without them (default 30).
    """

    def __init__(
        self, np: int, *, backend: str = "torch", use_gpu: bool = False, gpus_per_rank: int = 1,
        nodes: str = "host", spark=None, env: Optional[dict] = None, comm: Optional[dict] = None,
        log_ranks: Union[str, int, Sequence[int], None] = "0", log_dir: Optional[str] = None,
        log_sink: Optional[Callable[[str], Any]] = None, mlflow: Optional[bool] = None,
        start_timeout: Optional[float] = 180.0, data_timeout: Optional[float] = 300.0,
        timeout: Optional[float] = None, collective_timeout: Optional[float] = None,
        allow_unencrypted: bool = False, allow_unauthenticated: bool = False,
        max_restarts: int = 0, min_np: Optional[int] = None, checkpoint_dir: Optional[str] = None,
        model_bytes: Optional[int] = None, read_files: bool = True, work_dir: Optional[str] = None,
        staging_dir: Union[str, bool, None] = None, clean_work_dir: bool = False,
        warm_ranks: bool = True, roles: Optional[dict] = None, executor_loss: str = "restart",
        resize_wait: float = 30.0,
    ) -> None:  # fmt: skip
        self.backend_spec = spec = backends.get(backend)  # first: what else is checked depends on it
        np = _resolved_np(np, spark, use_gpu, gpus_per_rank)
        admission.check_arguments(
            np, start_timeout, timeout, collective_timeout, model_bytes, max_restarts, log_dir, data_timeout
        )
        self.roles = roles_.check(roles, spec, np, use_gpu=bool(use_gpu), min_np=min_np)
        self.np, self.backend = np, backend
        self.timeouts = settings.Timeouts.of(start_timeout, data_timeout, timeout, collective_timeout)
        gpus = admission.check_gpus_per_rank(gpus_per_rank, bool(use_gpu))
        self.placement = settings.Placement(bool(use_gpu), gpus, admission.check_nodes(nodes))
        self.comm = comm_settings.check(comm, spec, self.placement.use_gpu, self.timeouts.collective)
        self.roles = self.roles or roles_.reduction(self.comm, np, min_np)  # servers beside the workers
        self.world_size = self.roles.world if self.roles is not None else abs(np)  # every task's rank
        self.logs = settings.Logs.of(admission.parse_log_ranks(log_ranks, self.world_size), log_dir)
        self.workdir = settings.WorkDir(work_dir, bool(clean_work_dir))
        reserved = {**backends.reserved_env(), **comm_settings.reserved_env(self.comm, spec)}
        user = settings.check_env(env, reserved)
        self.env = settings.RankEnv(user=user, comm=comm_settings.rank_env(self.comm, spec))
        spec.check_installed()
        self.min_np, self.max_restarts = launchers.check_min_np(min_np, np, max_restarts), max_restarts
        self.checkpoint_dir, self.model_bytes, self.mlflow = checkpoint_dir, model_bytes, mlflow
        self.read_files, self.staging_dir = bool(read_files), admission.check_staging_dir(staging_dir)
        self.allow_unencrypted, self.allow_unauthenticated = allow_unencrypted, allow_unauthenticated
        self.warm_ranks = bool(warm_ranks)
        local = launchers.local_processes(np)
        self.executor_loss = executor_loss_.check(executor_loss, spec, local, max_restarts, self.roles)
        self.resize_wait = executor_loss_.check_resize_wait(resize_wait)
        self.spark, self.seed = spark, 0  # the seed of the shared split that deals a DataFrame's rows
        self.sink = log_sink or (lambda text: sys.stdout.write(text))

    @property
    def use_gpu(self) -> bool:
        return self.placement.use_gpu

    @property
    def gpus_per_rank(self) -> int:
        return self.placement.gpus_per_rank

    # ------------------------------------------------------------------ public API
    def run(self, main: Callable, *args, return_all: bool = False, **kwargs):
        """Run ``main(*args, **kwargs)`` on every rank; rank 0's return value (or all, in rank order)."""
        return self._run(None, main, args, kwargs, return_all)

    def run_with_data(
        self,
        df,
        main: Callable,
        *args,
        return_all: bool = False,
        replicas: Optional[int] = None,
        streams: Optional[int] = None,
        **kwargs,
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

        ``streams``: how many parts the rows are cut into for the sample order (default: one per
        data rank); fix it (e.g. 12) to make ``shard().dataloader(global_batch_size=G, seed=s)``
        give the same samples at every step on any world size it is a multiple of, and to resume
        a checkpoint's position on another world size.  See :mod:`sparkml_dist.runner.data.loader`.
        """
        readers = self.roles.readers if self.roles is not None else self.world_size  # not the servers
        replicas = admission.check_replicas(replicas, readers)
        if streams is not None:
            arg_checks.integer("streams", streams, 1)
            check_streams(streams, replicas or readers)
        return self._run(df, main, args, kwargs, return_all, replicas, streams)

    # ------------------------------------------------------------------ running
    def _run(self, df, main, args, kwargs, return_all: bool, replicas=None, streams=None):
        from ..errors import SparkMLDistError
        from .backends import needs as frameworks

        try:
            refused = roles_.refused_call(self.roles, return_all, df is not None)
            if refused is not None:
                raise refused
            frameworks.check(main, self.backend)  # a missing framework, a program for another backend
            return Run(self, df, main, args, kwargs, return_all, replicas, streams).execute()
        except SparkMLDistError as exc:
            if log.isEnabledFor(logging.DEBUG):
                raise
            # the error is the whole story (the rank's own traceback rides in it): the runner's
            # frames stay out of the user's traceback (logging.DEBUG keeps them)
            raise exc.with_traceback(None) from None
