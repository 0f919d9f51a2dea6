"""Launch one attempt of a run and wait for it: on Spark barrier tasks, or as local processes.  [driver]

:func:`choose` picks, once per run and from the sign of ``np`` (:func:`local_processes`, the one
place that tests it), a :class:`SparkLauncher` (``np > 0``) or a :class:`LocalLauncher` (``np <
0``); both have the same methods, so a run never asks which it holds.

Both launch paths hand the same :class:`~sparkml_dist.runner.task_spec.TaskSpec` to the same
:func:`~sparkml_dist.runner.tasks.task.supervise`; they differ in who gang-schedules the ranks (Spark's
barrier stage, or threads on the driver) and in how a run is cancelled (its job tag, or an event).
:func:`wait` is shared: it returns on success and cancels on a reported failure, the run's
:class:`Deadline`, or Ctrl-C.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, List, Optional

from .. import _spark_env, arg_checks, collection, launch
from ..errors import ConfigurationError, InsufficientResourcesError, RunTimeoutError
from ..gpus import assign_local, rank_profile
from . import admission, protocol
from .deadlines import Deadline, within
from .failures import FAILURE_GRACE_S, Monitor, results_too_large, translate
from .task_spec import TaskSpec
from .tasks import task as _task
from .tasks.gangs import ThreadGang


def _cancel_until_done(cancel: Callable[[], None], done: threading.Event, limit_s: float = 30.0) -> None:
    """Cancel, again and again until the job has ended: a cancel that lands before the job is
    submitted finds nothing to cancel, and the job would then run on."""
    end = time.monotonic() + limit_s
    cancel()
    while not done.wait(0.5) and time.monotonic() < end:
        cancel()


def wait(
    done: threading.Event,
    monitor: Monitor,
    cancel: Callable[[], None],
    errors: List[BaseException],
    deadline: Deadline,
) -> None:
    """Wait for the job, a reported failure, the deadline or Ctrl-C; cancel on anything but success."""
    try:
        with launch.own_interrupts():  # Ctrl-C stops this run, not every job of the SparkContext
            while not done.wait(0.1):
                if monitor.failure is not None:
                    monitor.wait_for_reports(FAILURE_GRACE_S)
                    _cancel_until_done(cancel, done)
                    _add_failures(monitor, errors)  # a report the log channel was too slow to bring
                    raise monitor.worker_error()
                if deadline.expired():
                    _cancel_until_done(cancel, done)
                    raise RunTimeoutError(
                        f"the run exceeded timeout={deadline.timeout}s; its Spark job was cancelled and "
                        f"every rank stopped. Ranks that reached the rendezvous: {sorted(monitor.reached)}."
                    )
    except KeyboardInterrupt:
        _cancel_until_done(cancel, done)
        raise
    if monitor.failure is not None:
        _add_failures(monitor, errors)
        raise monitor.worker_error()
    _add_failures(monitor, errors[1:])  # the first is translated with them
    if errors:
        raise translate(errors[0], monitor)


def _add_failures(monitor: Monitor, errors: List[BaseException]) -> None:
    """Ranks on the driver: every rank's failure goes to the root-cause choice, whichever thread
    ended first and whether or not its report came through the log channel in time."""
    for exc in errors:
        detail = protocol.parse_failure(str(exc))
        if detail is not None:
            monitor.add_failure(detail)


def launch_spark(spark, data_df, spec: TaskSpec, monitor: Monitor, deadline: Deadline, profile=None):
    """``np`` barrier tasks over ``data_df`` (rank r's shard in partition r), or over placeholders
    (plain tasks with ``executor_loss="replace"``: :mod:`.elastic.executor_loss`)."""
    tasks = spec.world_size // spec.ranks_per_task
    if not spec.barrier:
        from .elastic.executor_loss import refuse_spark_rows

        refuse_spark_rows(data_df)
    df = data_df if data_df is not None else spark.range(0, tasks, 1, tasks)
    out = launch.map_groups(
        df, _task.barrier_task, spec, barrier=spec.barrier, catch_errors=False, profile=profile
    )
    job = launch.JobTag(spark, f"run-{spec.run_id}")
    done, box, errors = threading.Event(), [], []

    def collect():
        try:
            with job.scope():
                box.append(out.toArrow())
        except BaseException as exc:  # reported to the waiting thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=collect, name=f"sparkml_dist-{spec.run_id}", daemon=True).start()
    wait(done, monitor, job.cancel, errors, deadline)
    return box[0]


def _local_shards(data_df, world: int) -> List[list]:
    """Rank r's batches: the rows of ``data_df``'s partition r."""
    import pyarrow as pa

    if data_df is None:
        return [[] for _ in range(world)]
    from pyspark.sql import functions as F

    table = data_df.withColumn("__sd_rank", F.spark_partition_id()).toArrow()
    ranks = table.column("__sd_rank").to_numpy()
    table = table.drop_columns(["__sd_rank"])
    return [table.filter(pa.array(ranks == r)).to_batches() for r in range(world)]


def launch_local(data_df, spec: TaskSpec, monitor: Monitor, deadline: Deadline):
    """``-np`` rank processes on the driver, gang-scheduled by threads."""
    import pyarrow as pa

    world = spec.world_size
    with within(data_df.sparkSession if data_df is not None else None, deadline, "collecting the shards"):
        shards = _local_shards(data_df, world)
    gang = ThreadGang(world)
    done, errors, outputs = threading.Event(), [], [[] for _ in range(world)]
    cancel = threading.Event()

    def rank_thread(r: int) -> None:
        member = gang.member(r)
        try:
            outputs[r].extend(_task.supervise(member, iter(shards[r]), spec, cancel=cancel))
        except BaseException as exc:
            errors.append(exc)
            member.abort()  # ranks still waiting at the gang exchange stop now
            # ranks already running get the same grace as the driver's reports: the first
            # failure seen may be a symptom of another rank's failure that is still exiting
            threading.Timer(FAILURE_GRACE_S, cancel.set).start()

    threads = [threading.Thread(target=rank_thread, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()

    def joiner():
        for t in threads:
            t.join()
        done.set()

    threading.Thread(target=joiner, daemon=True).start()
    wait(done, monitor, cancel.set, errors, deadline)
    table = pa.Table.from_batches([b for out in outputs for b in out], schema=collection.CHUNK_SCHEMA)
    if table.nbytes > spec.max_result_bytes:  # what Spark checks as results reach its driver
        raise results_too_large(
            f"{sum(len(o) > 0 for o in outputs)} ranks' results total {table.nbytes} bytes; the driver "
            f"takes {spec.max_result_bytes}: spark.driver.maxResultSize less 1 MiB for their framing"
        )
    return table


class SparkLauncher:
    """The ranks as Spark barrier tasks of ``spark`` (``np > 0``)."""

    local, what = False, "barrier tasks"  # its ranks run where Spark puts its barrier tasks

    def __init__(self, spark) -> None:
        from .. import executors

        self.spark = spark
        executors.use_driver_python(spark)  # a local master's executors start this Python

    def ranks_per_task(self, runner) -> int:
        """One rank per task, or one per ``gpus_per_rank`` GPUs a task holds."""
        return admission.ranks_per_task(self.spark, runner.world_size, runner.use_gpu, runner.gpus_per_rank)

    def check_python(self, main, tasks: int) -> None:
        """The executors' Python can run ``main``: the packages it imports there, at the driver's
        versions (once per session and executors: :func:`sparkml_dist.executors.check`)."""
        from .. import executors

        executors.check(self.spark, main, tasks, getattr(main, "__qualname__", "the function"))

    def check(self, runner, tasks: int, deadline: Deadline) -> None:
        """Refuse a run the cluster cannot hold (slots, GPUs, memory, encryption)."""
        try:
            admission.check_cluster(
                self.spark,
                tasks,
                use_gpu=runner.use_gpu,
                allow_unencrypted=runner.allow_unencrypted,
                allow_unauthenticated=runner.allow_unauthenticated,
                model_bytes=runner.model_bytes,
                wait_s=deadline.remaining(runner.timeouts.start or 60.0),
                say=runner.sink,
            )
        except InsufficientResourcesError as exc:
            if runner.roles is None:
                raise
            raise InsufficientResourcesError(
                f"{exc} With roles the job holds {runner.roles.describe()}: lower np (the workers) or "
                "the parameter servers, or add executors/cores"
            ) from None

    def rank_gpus(self, runner) -> Optional[tuple]:
        """Each rank's GPUs when they are the driver's (a local master), else None (the tasks')."""
        return assign_local(self.spark, runner.world_size, runner.use_gpu, False, runner.gpus_per_rank)

    def launch(self, runner, data_df, spec: TaskSpec, monitor: Monitor, deadline: Deadline):
        profile = rank_profile(self.spark, runner.use_gpu, runner.gpus_per_rank)
        return launch_spark(self.spark, data_df, spec, monitor, deadline, profile)


class LocalLauncher:
    """``-np`` rank processes on the driver (``np < 0``); ``spark``: the session of the DataFrame
    whose rows they read, if any (no Spark job runs otherwise)."""

    local, what = True, "local processes"  # its ranks are processes of this machine

    def check_python(self, main, tasks: int) -> None:
        """Local processes run this driver's own Python: nothing to check."""

    def __init__(self, spark: Any = None) -> None:
        self.spark = spark

    def ranks_per_task(self, runner) -> int:
        return 1

    def check(self, runner, tasks: int, deadline: Deadline) -> None:
        """The model must fit every GPU the ranks will use."""
        if runner.use_gpu and runner.model_bytes:
            from .. import plan

            per_rank = assign_local(None, runner.world_size, True, True, runner.gpus_per_rank)
            gpus = [g for rank_gpus in per_rank for g in rank_gpus]
            plan.check_fits_gpu(runner.model_bytes, plan.gpu_bytes(None, gpus))

    def rank_gpus(self, runner) -> Optional[tuple]:
        return assign_local(self.spark, runner.world_size, runner.use_gpu, True, runner.gpus_per_rank)

    def launch(self, runner, data_df, spec: TaskSpec, monitor: Monitor, deadline: Deadline):
        return launch_local(data_df, spec, monitor, deadline)


def local_processes(np_: int) -> bool:
    """Whether ``np`` asks for local processes on the driver (``np < 0``) rather than Spark barrier
    tasks (``np > 0``): the one place that tests its sign."""
    return np_ < 0


def check_min_np(min_np, np_: int, max_restarts: int) -> Optional[int]:
    """``min_np``: None, or 1 <= min_np <= np for Spark tasks (np > 0) with restarts to use it."""
    if min_np is None:
        return None
    arg_checks.integer("min_np", min_np, 1, fix="the fewest ranks a restart may run with (1 <= min_np <= np)")
    if local_processes(np_):
        raise ConfigurationError(
            f"min_np={min_np} with np={np_}: local processes (np < 0) always start all {-np_}; "
            "min_np is for Spark barrier tasks (np > 0), whose slots a lost host takes away"
        )
    if min_np > np_:
        raise ConfigurationError(f"min_np={min_np} is more than np={np_}: use 1 <= min_np <= np")
    if max_restarts < 1:
        raise ConfigurationError(
            f"min_np={min_np} only changes restarts, and max_restarts={max_restarts}: set "
            "max_restarts >= 1 (and checkpoint_dir, so a restart resumes)"
        )
    return min_np


def choose(np_: int, df, spark) -> "SparkLauncher | LocalLauncher":
    """The launcher of one run: local processes for ``np < 0``, else barrier tasks of the
    DataFrame's session, ``spark``, or the active session."""
    local = local_processes(np_)
    trial = os.environ.get(protocol.IN_TRIAL_ENV)
    if trial is not None and (not local or df is not None):
        raise ConfigurationError(
            f"BarrierRunner(np={np_}){' with a DataFrame' if df is not None else ''} inside Tuner "
            f"trial {trial}: a trial runs in a Spark task, and barrier jobs are started from the "
            "driver's Spark session. Inside a trial use BarrierRunner(np=-k).run(...) (k local "
            "processes on the trial's executor; give the Tuner trial_resources={'cpus': k}), or "
            "tune the BarrierRunner job from the driver one configuration at a time."
        )
    session = df.sparkSession if df is not None else None
    if local:
        return LocalLauncher(session)
    if session is None:
        session = spark or _spark_env.active_session(
            "BarrierRunner(np > 0)", "pass spark=..., or use np < 0 to run local processes without Spark"
        )
    return SparkLauncher(session)
