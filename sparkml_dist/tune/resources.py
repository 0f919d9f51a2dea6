"""What one trial may use and how many trials fit at once.  [driver]

``trial_resources={"cpus": c, "gpus": g}`` becomes a stage-level ResourceProfile on cluster
masters (each trial's one-task job asks Spark for ``c`` CPUs and ``g`` GPUs, and the trial reads
its GPU addresses from the task).  Local masters schedule no task resources: there the tuner
caps concurrency at ``cores // c`` itself and deals the driver's GPUs (``spark.driver.resource.gpu``,
else ``CUDA_VISIBLE_DEVICES`` / every torch device) to trials, ``g`` each.

The default ``max_concurrent`` is the smallest of: task slots for that many CPUs, GPUs / ``g``,
and the memory planner's models per executor (:func:`sparkml_dist.plan.plan_concurrency`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .. import _spark_env, plan
from .. import gpus as gpus_mod
from ..errors import InsufficientResourcesError

KEYS = gpus_mod.RESOURCE_KEYS


def check(resources: Optional[Dict[str, Any]], name: str = "trial_resources") -> Dict[str, int]:
    """``trial_resources`` (or the parameter ``name``) as ``{"cpus": int >= 1, "gpus": int >= 0}``."""
    return gpus_mod.check_resources(resources, name)


@dataclass
class Slots:
    concurrency: int
    profile: Any  # a ResourceProfile or None
    gpu_pool: Optional["GpuPool"]
    summary: str


class GpuPool:
    """The driver's GPUs, dealt ``per_trial`` at a time to trials of a local master."""

    def __init__(self, gpus: List[str], per_trial: int) -> None:
        self._free = list(gpus)
        self._per = per_trial
        self._lock = threading.Lock()

    def take(self) -> Tuple[str, ...]:
        with self._lock:
            taken, self._free = self._free[: self._per], self._free[self._per :]
        return tuple(taken)

    def give(self, gpus: Tuple[str, ...]) -> None:
        with self._lock:
            self._free.extend(gpus)


def task_profile(spark, resources: Optional[Dict[str, Any]], name: str):
    """:func:`sparkml_dist.gpus.resources_profile`: one rule for trials and per-group tasks."""
    return gpus_mod.resources_profile(spark, resources, name)


def plan_slots(spark, resources: Dict[str, int], payload_bytes: int, max_concurrent: Optional[int]) -> Slots:
    """How many trials run at once, and with which profile; refuses what can never run."""
    conf = _spark_env.conf_of(spark)
    master = _spark_env.master_of(spark)
    cluster = _spark_env.ClusterMemory.from_spark(spark)
    cpus, gpus = resources["cpus"] or cluster.task_cpus, resources["gpus"]
    per_executor = cluster.cores_per_executor // cpus
    if per_executor < 1:
        raise InsufficientResourcesError(
            f"trial_resources asks {cpus} CPUs per trial but an executor has {cluster.cores_per_executor} "
            "cores: lower trial_resources['cpus'] or give executors more cores"
        )
    caps = [f"{cluster.executors} executor(s) x {per_executor} trial(s) of {cpus} CPU(s)"]
    concurrency = cluster.executors * per_executor
    pool, profile = None, None
    local = _spark_env.is_local(master)
    if gpus:
        if local:
            have, _ = gpus_mod.local(spark)
            where = "the driver (local master)"
            pool = GpuPool(have, gpus)
            n_gpu = len(have) // gpus
        else:
            amount = conf("spark.executor.resource.gpu.amount", None)
            have = int(float(amount)) if amount else 0
            where = "each executor (spark.executor.resource.gpu.amount)"
            n_gpu = cluster.executors * (have // gpus)
        if n_gpu < 1:
            raise InsufficientResourcesError(
                f"trial_resources asks {gpus} GPU(s) per trial but {where} has "
                f"{len(have) if local else have}: "
                "give the cluster GPUs (spark.executor.resource.gpu.amount and a discovery script) or "
                "drop 'gpus' from trial_resources"
            )
        concurrency = min(concurrency, n_gpu)
        caps.append(f"{n_gpu} trial(s) by GPUs")
    if (resources["cpus"] or gpus) and not local:
        profile = gpus_mod.task_profile(cpus, gpus)
    memory = plan.plan_concurrency(spark, max(1, 2 * payload_bytes), cluster=cluster)
    if memory.concurrency < concurrency:
        concurrency = memory.concurrency
        caps.append(memory.summary())
    if max_concurrent is not None:
        concurrency = min(concurrency, max_concurrent)
        caps.append(f"max_concurrent={max_concurrent}")
    return Slots(max(1, concurrency), profile, pool, "; ".join(caps))


def plan_gangs(spark, ranks: int, use_gpu: bool, gpus_per_rank: int, max_concurrent: Optional[int]) -> Slots:
    """How many gang trials of ``ranks`` ranks run at once: the cluster's task slots (and, with
    ``use_gpu``, its GPUs) held by whole gangs, capped by ``max_concurrent``; refuses a gang that
    could never fit."""
    cluster = _spark_env.ClusterMemory.from_spark(spark)
    slots = cluster.executors * (cluster.cores_per_executor // max(1, cluster.task_cpus))
    gangs = slots // ranks
    caps = [f"{slots} task slot(s) / {ranks} ranks a trial"]
    if use_gpu:
        amount = _spark_env.conf_of(spark)("spark.executor.resource.gpu.amount", None)
        local = _spark_env.is_local(_spark_env.master_of(spark))
        have = len(gpus_mod.local(spark)[0]) if local else cluster.executors * int(float(amount or 0))
        gangs = min(gangs, have // (ranks * gpus_per_rank))
        caps.append(f"{have} GPU(s) / {ranks * gpus_per_rank} a trial")
    if gangs < 1:
        raise InsufficientResourcesError(
            f"ranks_per_trial={ranks} needs {ranks} task slots{' and GPUs' if use_gpu else ''} at once, "
            f"and the cluster holds fewer ({'; '.join(caps)}): lower ranks_per_trial or add executors"
        )
    if max_concurrent is not None:
        gangs = min(gangs, max_concurrent)
        caps.append(f"max_concurrent={max_concurrent}")
    return Slots(gangs, None, None, "; ".join(caps))
