"""Pre-flight checks of a run, before anything is launched.  [driver]

The arguments (``log_ranks``, the function and what it captures), the cluster (task slots, dynamic
allocation, encryption, GPU scheduling, memory for the model) and the stage-level GPU profile.
Every refusal names the setting or argument to change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Callable, Optional

from .. import _spark_env, arg_checks, plan, serialization
from .._spark_env import Conf
from ..errors import ConfigurationError, InsufficientResourcesError
from ..formats.files import private_dir_fault
from . import demand, rendezvous

log = logging.getLogger(__name__)


def check_arguments(
    np_, start_timeout, timeout, collective_timeout, model_bytes, max_restarts, log_dir, data_timeout=None
) -> None:
    """BarrierRunner's arguments, each refused with its name and what it takes."""
    if not isinstance(np_, int) or isinstance(np_, bool) or np_ == 0:
        raise ConfigurationError(
            f"np must be a non-zero integer (np > 0: Spark barrier tasks, "
            f"np < 0: local processes on the driver); got {np_!r}"
        )
    for name, value in (
        ("start_timeout", start_timeout),
        ("data_timeout", data_timeout),
        ("timeout", timeout),
        ("collective_timeout", collective_timeout),
    ):
        arg_checks.seconds(name, value)
    arg_checks.integer(
        "model_bytes",
        model_bytes,
        0,
        none_ok=True,
        fix="the bytes one rank's model needs (sparkml_dist.plan.model_bytes)",
    )
    arg_checks.integer("max_restarts", max_restarts, 0)
    if log_dir is not None and (not isinstance(log_dir, str) or "://" in log_dir):
        raise ConfigurationError(
            f"log_dir must be a directory path every executor can write (a local or mounted "
            f"path such as /dbfs/logs/run1), got {log_dir!r}"
        )
    if log_dir is not None and os.path.lexists(log_dir):  # here already: refused before any job
        why = private_dir_fault(os.lstat(log_dir))
        if why:
            raise ConfigurationError(
                f"log_dir={log_dir!r} {why}: every rank's output would be written where other users "
                "can read it or plant links. Pick a directory of your own that only you can write "
                "(chmod go-w), or leave log_dir unset"
            )


def check_staging_dir(staging_dir: Any) -> Any:
    """A directory path or URI (``s3://...``; a relative local path made absolute for the ranks),
    None (the default place), or False (never stage: the exact deal)."""
    if staging_dir is None or staging_dir is False:
        return staging_dir
    if not isinstance(staging_dir, str) or not staging_dir.strip():
        raise ConfigurationError(
            f"staging_dir must be a directory path or URI every executor writes and the driver reads "
            f"(e.g. /dbfs/tmp/staging or s3://bucket/staging), got {staging_dir!r}"
        )
    return staging_dir if "://" in staging_dir else os.path.abspath(staging_dir)


def parse_log_ranks(value, world: int) -> tuple:
    """``log_ranks`` ("all", "none", a rank, "0,2" or a list) as a tuple of ranks."""
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


def payload(main: Callable, args, kwargs, want_result: bool = True) -> bytes:
    """``(main, args, kwargs, want_result)`` as the bytes every rank loads; a clear error when the
    function or what it captures cannot travel."""
    if not callable(main):
        raise ConfigurationError(f"main must be callable, got {type(main).__name__}")
    what = f"{getattr(main, '__name__', main)!r} and its arguments"
    return serialization.travelling((main, args, kwargs, want_result), what, main)


def check_cluster(
    spark,
    world: int,
    *,
    use_gpu: bool,
    allow_unencrypted: bool,
    allow_unauthenticated: bool,
    model_bytes: Optional[int],
    wait_s: float,
    say=None,
) -> None:
    """Refuse a run the cluster cannot hold; ``wait_s``: how long to wait for executors to register
    (``say``: where the waiting line goes)."""
    conf = _spark_env.conf_of(spark)
    for warning in (
        check_encryption(conf, allow_unencrypted),
        check_authentication(conf, allow_unauthenticated),
    ):
        if warning:
            log.warning("%s", warning)
    master = _spark_env.master_of(spark)
    if model_bytes:
        plan.plan_concurrency(spark, model_bytes)  # raises when one model cannot fit a worker
        if use_gpu:
            local = _spark_env.local_master(spark)
            plan.check_fits_gpu(model_bytes, plan.gpu_bytes(spark, on_this_machine=local))
    check_slots(world, master, conf, _live_slots(spark, master, world, wait_s, say))
    if use_gpu and not _spark_env.is_local(master) and not _spark_env.schedules_gpus(conf):
        raise InsufficientResourcesError(
            "use_gpu=True but this cluster schedules no GPUs: set spark.executor.resource.gpu.amount, "
            "spark.task.resource.gpu.amount and spark.executor.resource.gpu.discoveryScript "
            "(spark.driver.resource.gpu.* in local mode), or use use_gpu=False."
        )


def _live_slots(spark, master: str, world: int, wait_s: float, say=None) -> Optional[int]:
    """Task slots of the executors registered now (classic Spark only; None if unknown).

    Executors of a cluster that has just started register over some seconds, and a cluster that
    can grow grows on demand: wait for enough of them (up to ``wait_s``) rather than fail, and
    when slots are short on a cluster that may grow, ask for them (:mod:`.demand`) saying so.
    """
    if _spark_env.is_connect(spark) or _spark_env.is_local(master):
        return None
    configured = _spark_env.master_slots(master, _spark_env.conf_of(spark))
    if configured is not None and world > configured:
        return _spark_env.registered_slots(spark)  # never enough (local-cluster): do not wait
    deadline = time.monotonic() + wait_s
    slots = _spark_env.registered_slots(spark)
    if slots is None or slots >= world:
        return slots  # None: no JVM access, Spark's own barrier check decides
    with contextlib.ExitStack() as stack:
        if wait_s > 2 and demand.may_grow(spark, master, world):
            stack.enter_context(demand.Demand(spark, world, wait_s))
            (say or log.warning)(
                f"[sparkml_dist] waiting up to {wait_s:.0f}s for {world} task slots ({slots} now): "
                f"a job of {world} tasks asks the cluster for them\n"
            )
        while True:
            time.sleep(0.5)
            slots = _spark_env.registered_slots(spark)
            if slots is None or slots >= world or time.monotonic() > deadline:
                return slots


def check_slots(np_: int, master: str, conf: Conf, live_slots: Optional[int] = None) -> None:
    """Refuse to launch ``np_`` barrier tasks on a cluster that cannot run them all at once."""
    configured = _spark_env.master_slots(master, conf)
    slots = live_slots if live_slots is not None else configured
    if configured is not None and np_ > configured:
        slots = configured  # the most it will ever have, however many have registered yet
    if configured is not None and live_slots is not None and live_slots < np_ <= configured:
        raise InsufficientResourcesError(
            f"np={np_} barrier tasks need {np_} task slots; {master} will have {configured} but only "
            f"{live_slots} are registered (executors still starting or lost). Retry shortly or lower np."
        )
    dyn = (conf("spark.dynamicAllocation.enabled", "false") or "false").lower() == "true"
    if dyn:
        cap = conf("spark.dynamicAllocation.maxExecutors", None)
        cores = int(conf("spark.executor.cores", "1") or 1) // _spark_env.task_cpus(conf)
        hint = (
            "barrier stages need every task running at once, which dynamic allocation cannot "
            "promise; set spark.dynamicAllocation.enabled=false"
        )
        if cap is not None and int(cap) * cores < np_:
            raise InsufficientResourcesError(
                f"np={np_} barrier tasks need {np_} task slots but dynamic allocation allows at most "
                f"{int(cap) * cores} (spark.dynamicAllocation.maxExecutors={cap} x "
                f"spark.executor.cores/spark.task.cpus); {hint}, or lower np."
            )
        if slots is None or slots < np_:
            raise InsufficientResourcesError(
                f"np={np_} barrier tasks need {np_} task slots but only {slots or 0} are available "
                f"now and spark.dynamicAllocation.enabled=true; {hint}, or lower np."
            )
        return
    if slots is not None and slots < np_:
        raise InsufficientResourcesError(
            f"np={np_} barrier tasks need {np_} task slots but the cluster has {slots} ({master}, "
            f"spark.task.cpus={conf('spark.task.cpus', '1')}). Lower np or add executors/cores."
        )


# Each setting that makes Spark encrypt something: the RPC (AES-based, or TLS, Spark 4's preferred way,
# which spark.ssl.enabled does not imply), the UI and file server, the shuffle and spill files.
ENCRYPTION_KEYS = (
    "spark.network.crypto.enabled",
    "spark.ssl.rpc.enabled",
    "spark.ssl.enabled",
    "spark.io.encryption.enabled",
)


def check_encryption(conf: Conf, allow_unencrypted: bool) -> Optional[str]:
    """Refuse an encrypted cluster (gloo/NCCL traffic is not encrypted) unless opted in.

    Returns a warning text when the user opted in, None when the cluster is not encrypted.
    """
    keys = [k for k in ENCRYPTION_KEYS if (conf(k, "false") or "false").lower() == "true"]
    if not keys:
        return None
    text = (
        f"this cluster is configured for encryption ({', '.join(k + '=true' for k in keys)}), but "
        "torch.distributed traffic between ranks (gloo/NCCL) is not encrypted"
    )
    if not allow_unencrypted:
        raise ConfigurationError(
            f"{text}. Refusing to start; pass allow_unencrypted=True to BarrierRunner to accept "
            "unencrypted collective traffic on this network."
        )
    return text + "; running anyway because allow_unencrypted=True."


def check_authentication(conf: Conf, allow_unauthenticated: bool) -> Optional[str]:
    """Refuse a cluster with ``spark.authenticate=true`` unless opted in: the ranks' rendezvous store
    and gloo/NCCL connections accept any peer that reaches their ports (torch.distributed and Horovod
    have no authentication), which such a cluster's operator did not ask for.

    Returns a warning text when the user opted in, None when the cluster does not authenticate.
    """
    if (conf("spark.authenticate", "false") or "false").lower() != "true":
        return None
    text = (
        "this cluster authenticates its connections (spark.authenticate=true), but the ranks' "
        "rendezvous store and collective connections (torch.distributed / Horovod) accept any peer "
        "that can reach their ports; only the log channel to the driver is authenticated"
    )
    if not allow_unauthenticated:
        raise ConfigurationError(
            f"{text}. Refusing to start; pass allow_unauthenticated=True to BarrierRunner to accept "
            "unauthenticated rank-to-rank connections on this network."
        )
    return text + "; running anyway because allow_unauthenticated=True."


def _ranks_per_task_of(spark, np_: int, per_rank: int) -> int:
    amount = _spark_env.conf_of(spark)("spark.task.resource.gpu.amount", None)
    if amount is None:
        return 1  # the stage-level profile asks per_rank GPUs for each task
    k = float(amount)
    if k != int(k) or int(k) % per_rank:
        raise ConfigurationError(
            f"gpus_per_rank={per_rank} does not divide spark.task.resource.gpu.amount={amount}: a task "
            f"runs whole ranks of {per_rank} GPUs each"
        )
    ranks = int(k) // per_rank
    if np_ % ranks:
        raise ConfigurationError(
            f"np={np_} ranks cannot fill tasks of {ranks} ranks ({amount} GPUs, {per_rank} per rank); "
            f"use a multiple of {ranks}"
        )
    return ranks


def check_gpus_per_rank(gpus_per_rank: Any, use_gpu: bool) -> int:
    arg_checks.integer("gpus_per_rank", gpus_per_rank, 1)
    if gpus_per_rank > 1 and not use_gpu:
        raise ConfigurationError(f"gpus_per_rank={gpus_per_rank} needs use_gpu=True")
    return gpus_per_rank


def check_replicas(replicas: Any, world: int) -> Optional[int]:
    """``run_with_data(replicas=)``: None, or a positive integer dividing the world size."""
    if replicas is None:
        return None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1 or world % replicas:
        raise ConfigurationError(
            f"replicas must be a positive integer dividing np={world} (the pipeline's data_parallel: "
            f"np / replicas ranks, its stages, read each shard), got {replicas!r}"
        )
    return replicas


def check_nodes(nodes: Any) -> str:
    """``nodes`` of BarrierRunner, refused unless it names a rule of :mod:`.rendezvous`."""
    if nodes not in rendezvous.NODE_RULES:
        raise ConfigurationError(
            f"nodes must be one of {rendezvous.NODE_RULES} (what LOCAL_RANK and GROUP_RANK count: a "
            f"machine's ranks, as torchrun, or a Spark task's, as pyspark's TorchDistributor), got {nodes!r}"
        )
    return nodes


def ranks_per_task(spark, np_: int, use_gpu: bool, per_rank: int = 1) -> int:
    """How many ranks each barrier task runs: one per ``per_rank`` GPUs it holds
    (``spark.task.resource.gpu.amount`` whole and >= 2 on a cluster), else 1.  ``np`` counts
    ranks, as on Databricks; it must then be a multiple of that number."""
    if not use_gpu or _spark_env.local_master(spark):
        return 1
    if per_rank > 1:
        return _ranks_per_task_of(spark, np_, per_rank)
    amount = _spark_env.conf_of(spark)("spark.task.resource.gpu.amount", None)
    try:
        k = float(amount) if amount is not None else 1.0
    except ValueError:
        return 1
    if k < 2:
        return 1
    if k != int(k):
        raise ConfigurationError(
            f"spark.task.resource.gpu.amount={amount}: a task holding more than one GPU holds a whole "
            "number of them; the runner runs one rank per GPU"
        )
    if np_ % int(k):
        raise ConfigurationError(
            f"np={np_} ranks cannot fill tasks of {int(k)} GPUs (spark.task.resource.gpu.amount="
            f"{amount}): np counts ranks, one per GPU; use a multiple of {int(k)}"
        )
    return int(k)
