"""GPUs: which a process sees, which a task holds, how ranks and members get theirs.  [anywhere]

One copy of each rule the runner, the tuner, bagging (``useGpu``) and search (``use_gpu``) share:

* :func:`visible` — the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` read as CUDA does);
* :func:`local` — the GPUs of the driver's machine: Spark's ``spark.driver.resource.gpu.*`` when
  configured, else the visible ones (local masters and local processes deal these out);
* :func:`task_addresses` / :func:`task_gpus` — the GPUs Spark assigned to a task;
* :func:`task_profile` / :func:`rank_profile` — the stage-level profile asking GPUs per task;
  :func:`check_resources` / :func:`resources_profile` — a ``{"cpus": c, "gpus": g}`` a user asks
  per task (trials, per-group training), checked and turned into that profile;
* :func:`assign_local`, :func:`rank_gpus` — each rank's GPUs, on the driver's machine or in a task;
* :func:`node_gpus`, :func:`gpu_env` — torchrun's device rules: what ``CUDA_VISIBLE_DEVICES``
  a rank sees and which index in it is its own;
* :func:`plan_models` / :func:`place_model` — a model per task on a GPU (bagging members, grouped
  and search fits with ``useGpu``/``use_gpu``): an estimator with a ``device`` parameter (XGBoost's
  ``device="cuda:0"``) gets its task's GPU, or on a local master one of the driver's GPUs dealt by
  group number; refused before any job for an estimator without one.

Example::

    gpus.local(spark)                        # (["0", "1"], "spark.driver.resource.gpu")
    gpus.task_addresses()                    # inside a Spark task: ["3"]
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import ConfigurationError, InsufficientResourcesError

DEVICE_ENV = "SPARKML_DIST_CUDA_DEVICE"  # a rank's index in CUDA_VISIBLE_DEVICES (context().device)
DEVICES_ENV = "SPARKML_DIST_CUDA_DEVICES"  # the indices of all its GPUs (gpus_per_rank > 1)


def visible(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    ``CUDA_VISIBLE_DEVICES`` when set (read as CUDA does: up to the first ``-1`` or empty entry;
    indices or ``GPU-<uuid>`` names), else every device torch sees (none without a CUDA torch).
    """
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        out = []
        for entry in listed.split(","):
            entry = entry.strip()
            if not entry or entry == "-1":
                break
            out.append(entry)
        return out
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def local(spark=None) -> Tuple[List[str], str]:
    """The GPUs of the driver's machine and where that list came from: Spark's
    ``spark.driver.resource.gpu.*`` when configured, else :func:`visible`."""
    if spark is not None:
        from . import _spark_env

        gpus = _spark_env.driver_gpus(spark)
        if gpus is not None:
            return list(gpus), "spark.driver.resource.gpu"
    source = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in os.environ else "torch.cuda"
    return visible(), source


def task_addresses(resources: Optional[Mapping[str, Any]] = None) -> List[str]:
    """The GPU addresses in a task's resources (``TaskContext.resources()``; the running task's
    when None, none outside a task)."""
    if resources is None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        resources = ctx.resources() if ctx is not None else {}
    gpu = resources.get("gpu") if resources else None
    return list(getattr(gpu, "addresses", []) or []) if gpu is not None else []


def task_profile(cpus: int, gpus: float):
    """A stage-level ResourceProfile asking ``cpus`` CPUs and ``gpus`` GPUs for each task."""
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    req = TaskResourceRequests().cpus(max(1, cpus))
    if gpus:
        req = req.resource("gpu", gpus)
    return ResourceProfileBuilder().require(req).build


RESOURCE_KEYS = ("cpus", "gpus")


def check_resources(resources: Optional[Dict[str, Any]], name: str = "resources") -> Dict[str, int]:
    """``resources`` (the parameter ``name``) as ``{"cpus": int >= 0, "gpus": int >= 0}``."""
    from . import arg_checks

    if resources is None:
        return {"cpus": 0, "gpus": 0}
    if not isinstance(resources, dict) or set(resources) - set(RESOURCE_KEYS):
        raise ConfigurationError(
            f"{name} must be a dict with keys among {list(RESOURCE_KEYS)}, got {resources!r}; "
            f"e.g. {name}={{'cpus': 2, 'gpus': 1}}"
        )
    out = {}
    for key in RESOURCE_KEYS:
        value = resources.get(key, 0)
        arg_checks.integer(f"{name}[{key!r}]", value, 0)
        out[key] = value
    return out


def resources_profile(spark, resources: Optional[Dict[str, Any]], name: str):
    """The stage-level profile of tasks asking ``resources`` (None where nothing is asked, and on
    local masters, which schedule no task resources); refuses what no executor has.  [driver]"""
    from . import _spark_env

    res = check_resources(resources, name)
    if not (res["cpus"] or res["gpus"]):
        return None
    cluster = _spark_env.ClusterMemory.from_spark(spark)
    if res["cpus"] > cluster.cores_per_executor:
        raise InsufficientResourcesError(
            f"{name} asks {res['cpus']} CPUs per task but an executor has {cluster.cores_per_executor} "
            f"cores: lower {name}['cpus'] or give executors more cores"
        )
    if _spark_env.local_master(spark):
        return None
    return task_profile(res["cpus"] or cluster.task_cpus, res["gpus"])


def task_gpus(resources: Dict[str, object], use_gpu: bool, rank: int) -> Optional[List[str]]:
    """GPU addresses Spark assigned to this task (``BarrierTaskContext.resources()``)."""
    if not use_gpu:
        return None
    addresses = task_addresses(resources)
    if not addresses:
        raise InsufficientResourcesError(
            f"use_gpu=True but Spark assigned no GPU to the task of rank {rank}. Configure GPU "
            "scheduling: spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount and a "
            "discovery script (spark.executor.resource.gpu.discoveryScript), or set use_gpu=False."
        )
    return addresses


def rank_profile(spark, use_gpu: bool, per_rank: int = 1):
    """A stage-level profile asking ``per_rank`` GPUs per task, when the cluster does not set one.

    With ``spark.task.resource.gpu.amount`` set, Spark already gives each task its GPUs.
    Otherwise (executors have GPUs, tasks request none by default) this stage asks for one.
    """
    from . import _spark_env

    if not use_gpu or spark.conf.get("spark.task.resource.gpu.amount", None):
        return None
    if _spark_env.local_master(spark):
        return None  # local mode schedules no task resources: the ranks get the driver's GPUs
    return task_profile(_spark_env.task_cpus(_spark_env.conf_of(spark)), per_rank)


def assign_local(
    spark, world: int, use_gpu: bool, local_processes: bool, per_rank: int = 1
) -> Optional[tuple]:
    """The GPUs of each rank (a tuple of ``per_rank`` addresses per rank) when the ranks run on the
    driver's machine, else None.

    Local processes (``np < 0``) and local Spark masters (``local[N]``, where Spark assigns no
    GPU to tasks) take ``per_rank`` GPUs each, in order, from the driver's GPUs: Spark's
    ``spark.driver.resource.gpu.*`` when configured, else ``CUDA_VISIBLE_DEVICES`` / every device.
    """
    if not use_gpu:
        return None
    from . import _spark_env

    if not local_processes and not _spark_env.local_master(spark):
        return None
    gpus, source = local(spark)
    need = world * per_rank
    if need > len(gpus):
        each = "one GPU per rank" if per_rank == 1 else f"{per_rank} GPUs per rank (gpus_per_rank)"
        raise InsufficientResourcesError(
            f"use_gpu=True runs {each}: {world} ranks need {need} GPUs, but this machine shows "
            f"{len(gpus)} ({source}: {gpus or 'none'}). Lower np to "
            f"{len(gpus) // per_rank or 'a CPU run'} or set use_gpu=False."
        )
    return tuple(tuple(gpus[r * per_rank : (r + 1) * per_rank]) for r in range(world))


def rank_gpus(
    task_gpus: Sequence[str], member: int, per_task: int, rank: int, per_rank: int = 1
) -> List[str]:
    """The GPUs of the ``member``-th rank of a task that runs a rank per ``per_rank`` GPUs it holds."""
    if len(task_gpus) < per_task * per_rank:
        raise InsufficientResourcesError(
            f"the task of rank {rank} runs {per_task} ranks of {per_rank} GPU(s) each, but Spark "
            f"assigned it {len(task_gpus)} GPU(s) ({', '.join(task_gpus)})"
        )
    return list(task_gpus[member * per_rank : (member + 1) * per_rank])


def node_gpus(rank: int, keys: Sequence[str], gpus: Sequence[Optional[Sequence[str]]]) -> Optional[List[str]]:
    """CUDA_VISIBLE_DEVICES for ``rank``: its node's GPUs in local-rank order (torchrun's rule:
    ``LOCAL_RANK`` then indexes the rank's own GPU, and NCCL sees its peers on the node), when every
    rank of the node holds exactly one GPU and no two share one; otherwise (several GPUs per rank,
    GPUs shared through fractional amounts) the rank sees only its own, from index 0."""
    mine = gpus[rank] if gpus else None
    if mine is None:
        return None
    same = [gpus[r] for r, k in enumerate(keys) if k == keys[rank]]
    if all(g is not None and len(g) == 1 for g in same):
        flat = [g[0] for g in same]  # type: ignore[index]
        if len(set(flat)) == len(flat):
            return flat
    return list(mine)


def gpu_env(
    rank: int, keys: Sequence[str], gpus: Optional[Sequence[Optional[Sequence[str]]]]
) -> Dict[str, str]:
    """CUDA_VISIBLE_DEVICES and the index of the rank's (first) GPU in it (``context().device``)."""
    visible = node_gpus(rank, keys, gpus) if gpus else None
    if visible is None:
        return {}
    own = ",".join(str(visible.index(g)) for g in gpus[rank])
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible), DEVICE_ENV: own.split(",")[0], DEVICES_ENV: own}


# ------------------------------------------------------------------ a model per task on a GPU
def _has_device(estimator: Any) -> bool:
    try:
        return "device" in estimator.get_params(deep=False)
    except Exception:  # noqa: BLE001 - not a scikit-learn-API estimator: it has no device to set
        return False


def plan_models(
    spark, estimator: Any, use_gpu: bool, param: str, member_bytes: int = 0
) -> Tuple[Optional[Tuple[str, ...]], Any]:
    """``(gpus, profile)`` for the fitting tasks: ``gpus`` None without GPUs, ``()`` for the
    task's own GPU (a cluster), else the driver's GPUs to deal; ``profile`` a stage-level
    ResourceProfile or None. How many members share a GPU comes from ``member_bytes`` (one
    member's GPU memory) and :mod:`sparkml_dist.plan`, which refuses a member no GPU holds."""
    if not use_gpu:
        return None, None
    if not _has_device(estimator):
        raise ConfigurationError(
            f"{param}=True but {type(estimator).__name__} has no 'device' parameter to put it on a GPU; "
            "use an estimator that takes one (XGBoost: XGBClassifier/XGBRegressor), or set "
            f"{param}=False"
        )
    from . import _spark_env
    from . import plan as plans

    if _spark_env.local_master(spark):
        gpus, _ = local(spark)
        if not gpus:
            raise InsufficientResourcesError(
                f"{param}=True but this machine shows no GPU (spark.driver.resource.gpu, "
                "CUDA_VISIBLE_DEVICES or torch.cuda); set it to False"
            )
        plan = plans.plan_gpu_members(spark, member_bytes, len(gpus))
        if plan.concurrency < plan.slots_per_executor:  # a local master's tasks all run at once
            raise InsufficientResourcesError(
                f"{param}=True on {_spark_env.master_of(spark)}: its {plan.slots_per_executor} task slots "
                f"fit members at once, more than the GPUs hold: {plan.summary()}. Start Spark with "
                f"local[{plan.concurrency}], or lower gpuMemoryPerMember if the estimate is high"
            )
        return tuple(gpus), None
    plan = plans.plan_gpu_members(spark, member_bytes)
    if plan.task_gpu_amount != plan.gpu_per_task:  # fewer tasks on a GPU than the cluster would put
        return (), task_profile(_spark_env.task_cpus(_spark_env.conf_of(spark)), plan.task_gpu_amount)
    return (), rank_profile(spark, True)


def place_model(model: Any, gpus: Sequence[str], group: int) -> str:
    """Set ``model``'s ``device`` to the GPU of this member (the task's, or the driver's GPU
    ``group mod len(gpus)``); returns it."""
    if gpus:
        address = gpus[group % len(gpus)]
    else:
        addresses = task_addresses()
        if not addresses:
            raise InsufficientResourcesError(
                f"useGpu=True but Spark assigned no GPU to the task fitting group {group}: configure GPU "
                "scheduling (spark.executor.resource.gpu.amount and a discovery script)"
            )
        address = addresses[0]
    device = f"cuda:{address}"
    model.set_params(device=device)
    return device
