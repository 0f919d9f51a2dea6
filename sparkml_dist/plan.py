"""How many models fit in memory at once: the memory rule and a planner over the Spark conf.  [driver]

The memory rule for independent models trained side by side::

    bytes of one model = parameters x bytes per parameter (2 fp16, 4 fp32, 8 fp64)
                         x 2 when trained by backpropagation (gradients)
                         x batch size when batched
                         x steps when it carries recurrent state
    concurrent models per node = memory of the node / bytes of one model

:func:`model_bytes` is that formula (a parameter count, an ``nn.Module`` or a fitted scikit-learn
estimator in, bytes out).  :func:`plan_concurrency` applies it to the cluster: it reads executor
memory and cores from the Spark configuration (:class:`~sparkml_dist._spark_env.ClusterMemory`, the
package's one memory rule) and returns how many models
fit per executor and how many may run at once, or raises
:class:`~sparkml_dist.errors.InsufficientResourcesError` naming the estimate and the settings to
change when not even one fits.

**GPUs** (the documents' N_total for GPU executors, :func:`plan_gpu_members`): members at once =
executors x min(task slots by CPU, GPUs per executor / GPUs per task, GPUs per executor x
floor(GPU memory / one member's GPU memory)). GPUs per executor and per task:
``spark.executor.resource.gpu.amount`` and ``spark.task.resource.gpu.amount`` (a fraction shares a
GPU; unset: one per task; a local master: the driver's GPUs); a GPU's memory:
``spark.sparkml_dist.gpu.memory`` (the driver cannot ask an executor's GPU; a local master:
``torch.cuda.mem_get_info``). Where tasks sharing a GPU would not fit in it, the plan asks a larger
share per task (``task_gpu_amount``); a member no GPU holds is refused, naming both figures; where
the GPU memory is unknown the plan says so (``memory_known``, its summary, a warning).

Example::

    from sparkml_dist.plan import model_bytes, plan_concurrency

    need = model_bytes(net, precision="fp32", backprop=True, batch_size=32)
    p = plan_concurrency(spark, need)
    print(p.summary())     # "2 executors x min(4 slots, 12 models) = 8 models at once ..."
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ._spark_env import ClusterMemory
from .errors import ConfigurationError, InsufficientResourcesError

log = logging.getLogger(__name__)

BYTES_PER_PARAM = {
    "fp16": 2,
    "bf16": 2,
    "float16": 2,
    "bfloat16": 2,
    "fp32": 4,
    "float32": 4,
    "fp64": 8,
    "float64": 8,
}


def parameter_count(model: Any) -> int:
    """Trainable size of ``model``: an int as is, an ``nn.Module``'s parameters and buffers, or the
    number of numeric values held by a fitted scikit-learn estimator (its arrays, trees included)."""
    if isinstance(model, (int, np.integer)) and not isinstance(model, bool):
        if model < 0:
            raise ConfigurationError(f"a parameter count must be >= 0, got {model}")
        return int(model)
    if hasattr(model, "parameters") and hasattr(model, "buffers") and callable(model.parameters):
        return int(sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers()))
    if hasattr(model, "get_params"):
        return int(_numeric_values(model))
    raise ConfigurationError(
        f"cannot count the parameters of a {type(model).__name__}: pass an int, "
        "a torch.nn.Module or a fitted scikit-learn estimator"
    )


def _numeric_values(obj: Any, seen: Optional[set] = None) -> int:
    """Numeric values reachable from ``obj`` (arrays, numbers, estimators, tree states)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        if obj.dtype.fields:  # a structured array (a tree's nodes): one value per field per row
            return obj.size * len(obj.dtype.fields)
        if obj.dtype == object:
            return sum(_numeric_values(v, seen) for v in obj.ravel())
        return obj.size
    if isinstance(obj, (bool, int, float, np.number)):
        return 1
    if isinstance(obj, dict):
        return sum(_numeric_values(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_numeric_values(v, seen) for v in obj)
    if isinstance(obj, (str, bytes, type(None))):
        return 0
    state = None
    if hasattr(obj, "__getstate__"):
        try:
            state = obj.__getstate__()
        except Exception:
            state = None
    if state is None and hasattr(obj, "__reduce__"):  # extension types (sklearn's Tree)
        try:
            state = obj.__reduce__()
        except Exception:
            state = None
    if state is None:
        state = getattr(obj, "__dict__", None)
    return _numeric_values(state, seen) if state is not None else 0


def model_bytes(
    model: Any,
    *,
    precision: str = "fp32",
    backprop: bool = False,
    batch_size: int = 1,
    steps: int = 1,
    stages: int = 1,
) -> int:
    """The memory rule: parameters x bytes per parameter x (2 if backprop) x batch x steps.

    ``model``: a parameter count, an ``nn.Module`` or a fitted estimator (see :func:`parameter_count`).
    ``stages``: the model is split into this many pipeline stages (:mod:`sparkml_dist.parallel`);
    the bytes are those of the largest stage (its layers' parameters, split as evenly as
    ``balance="memory"`` would), i.e. what one rank holds.
    """
    if precision not in BYTES_PER_PARAM:
        raise ConfigurationError(f"precision must be one of {sorted(BYTES_PER_PARAM)}, got {precision!r}")
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(stages, (int, np.integer)) or stages < 1:
        raise ConfigurationError(f"stages must be an integer >= 1, got {stages!r}")
    count = parameter_count(model) if stages == 1 else _largest_stage_count(model, int(stages))
    return count * BYTES_PER_PARAM[precision] * (2 if backprop else 1) * batch_size * steps


def _largest_stage_count(model: Any, stages: int) -> int:
    from .stages import blocks_of, largest_stage

    if isinstance(model, (int, np.integer)) and not isinstance(model, bool):
        return -(-parameter_count(model) // stages)  # an even split, rounded up
    per_layer = [parameter_count(b) for b in blocks_of(model).modules]
    return int(largest_stage(per_layer, stages))


def estimator_bytes(fitted: Any) -> int:
    """Memory a fitted scikit-learn-API model holds: its pickled size (dominated by its arrays)."""
    return len(pickle.dumps(fitted, protocol=pickle.HIGHEST_PROTOCOL))


# --------------------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class ConcurrencyPlan:
    bytes_per_model: int
    models_per_executor: int
    slots_per_executor: int
    executors: int
    concurrency: int
    cluster: ClusterMemory

    def summary(self) -> str:
        return (
            f"{self.executors} executor(s) x min({self.slots_per_executor} slots, "
            f"{self.models_per_executor} models of {self.bytes_per_model / 2**20:.1f} MiB) = "
            f"{self.concurrency} models at once"
        )


def plan_concurrency(
    spark,
    bytes_per_model: int,
    *,
    max_concurrent: Optional[int] = None,
    cluster: Optional[ClusterMemory] = None,
) -> ConcurrencyPlan:
    """How many models of ``bytes_per_model`` run at once; refuses when none fits an executor."""
    c = cluster or ClusterMemory.from_spark(spark)
    per_exec = c.python_bytes_per_executor // max(1, int(bytes_per_model))
    if per_exec < 1:
        raise InsufficientResourcesError(
            f"one model needs about {bytes_per_model / 2**20:.1f} MiB but an executor's Python "
            f"workers have {c.python_bytes_per_executor / 2**20:.1f} MiB ({c.source}). Give them "
            "more memory (spark.executor.pyspark.memory, spark.executor.memoryOverhead), or "
            "shrink the model (fewer parameters, lower precision, smaller batches)."
        )
    concurrency = c.executors * min(c.slots_per_executor, per_exec)
    if max_concurrent is not None:
        if not isinstance(max_concurrent, (int, np.integer)) or max_concurrent < 1:
            raise ConfigurationError(
                f"max_concurrent must be an integer >= 1 or None, got {max_concurrent!r}"
            )
        concurrency = min(concurrency, int(max_concurrent))
    return ConcurrencyPlan(
        int(bytes_per_model), int(per_exec), c.slots_per_executor, c.executors, max(1, concurrency), c
    )


# --------------------------------------------------------------------------- GPUs
GPU_MEMORY_CONF = "spark.sparkml_dist.gpu.memory"  # e.g. "80g": the memory of one executor GPU


def gpu_bytes(spark=None, gpus=None, on_this_machine: bool = True) -> Optional[tuple]:
    """(bytes of the smallest GPU a rank may get, where that figure comes from), or None if unknown.

    ``spark.sparkml_dist.gpu.memory`` when set (executors' GPUs cannot be asked from the driver);
    else, when the ranks run ``on_this_machine``, ``torch.cuda.mem_get_info`` of each of ``gpus``
    (indices in ``CUDA_VISIBLE_DEVICES`` order; default: every visible device).
    """
    text = spark.conf.get(GPU_MEMORY_CONF, None) if spark is not None else None
    if text:
        from ._spark_env import parse_bytes

        return parse_bytes(str(text)), GPU_MEMORY_CONF
    if not on_this_machine:
        return None  # the driver's GPUs (if any) say nothing of the executors'
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    indices = range(len(gpus)) if gpus else range(torch.cuda.device_count())
    totals = [torch.cuda.mem_get_info(i)[1] for i in indices]
    return (min(totals), "torch.cuda.mem_get_info") if totals else None


def check_fits_gpu(bytes_per_rank: int, gpu: Optional[tuple]) -> None:
    """Refuse a model whose one-rank share cannot fit one GPU (``gpu`` from :func:`gpu_bytes`)."""
    if gpu is None or bytes_per_rank <= gpu[0]:
        return
    raise InsufficientResourcesError(
        f"one rank's model needs about {bytes_per_rank / 2**30:.2f} GiB but a GPU has "
        f"{gpu[0] / 2**30:.2f} GiB ({gpu[1]}). Split it (sparkml_dist.parallel.pipeline, FSDP2's "
        "fully_shard; model_bytes(..., stages=k) sizes one stage), lower the precision or the batch."
    )


# --------------------------------------------------------------------------- members on GPUs
ESTIMATE_FACTOR = 4  # a member's rows x (features + label + weight) x 4 bytes, this many times over


def member_gpu_bytes(use_gpu: bool, given: int, rows: int, columns: int) -> int:
    """One member's GPU memory for the plan: ``given`` (``gpuMemoryPerMember``), else an estimate
    from the largest member: its rows x (columns + label + weight) as float32, times
    :data:`ESTIMATE_FACTOR` (the data, gradients and histograms of a boosted fit); 0 without GPUs."""
    return (given or int(max(1, rows) * max(1, columns + 2) * 4 * ESTIMATE_FACTOR)) if use_gpu else 0


@dataclass(frozen=True)
class GpuPlan:
    """What :func:`gpu_members` decided, with the figures it came from."""

    bytes_per_member: int
    executors: int
    slots_per_executor: int  # by CPU
    gpus_per_executor: int
    gpu_per_task: float  # the cluster's setting (1 when unset)
    gpu_memory: Optional[int]  # one GPU's, None when unknown
    memory_source: str
    task_gpu_amount: float  # what each fitting task asks: gpu_per_task, or a larger share
    concurrency: int

    @property
    def memory_known(self) -> bool:
        return self.gpu_memory is not None

    @property
    def tasks_by_gpu(self) -> int:
        return int(self.gpus_per_executor / self.task_gpu_amount + 1e-9)

    def summary(self) -> str:
        size = f"{self.bytes_per_member / 2**30:.1f} GiB"
        memory = (
            f"GPU memory unknown ({self.memory_source}): members of about {size} not checked against it"
            if self.gpu_memory is None
            else f"{self.gpu_memory // max(1, self.bytes_per_member)} member(s) of {size} in a GPU of "
            f"{self.gpu_memory / 2**30:.1f} GiB"
        )
        return (
            f"{self.executors} executor(s) x min({self.slots_per_executor} slots by CPU, "
            f"{self.tasks_by_gpu} tasks by GPU ({self.gpus_per_executor} GPUs, "
            f"{self.task_gpu_amount:g} GPU per task; {memory})) = {self.concurrency} members at once"
        )


def gpu_members(
    executors: int, slots_per_executor: int, gpus_per_executor: int, gpu_per_task: float,
    gpu_memory: Optional[int], bytes_per_member: int, memory_source: str = GPU_MEMORY_CONF,
    param: str = "gpuMemoryPerMember",
) -> GpuPlan:  # fmt: skip
    """The rule of the module docstring ("GPUs") on plain figures."""
    if gpus_per_executor < 1:
        raise InsufficientResourcesError(
            "useGpu=True but the executors have no GPU (spark.executor.resource.gpu.amount and a "
            "discovery script; on a local master, CUDA_VISIBLE_DEVICES): set useGpu=False"
        )
    amount = float(gpu_per_task) if gpu_per_task and gpu_per_task > 0 else 1.0
    if gpu_memory is not None:
        per_gpu = gpu_memory // max(1, bytes_per_member)
        if per_gpu < 1:
            raise InsufficientResourcesError(
                f"one member needs about {bytes_per_member / 2**30:.2f} GiB of GPU memory ({param}) but "
                f"a GPU has {gpu_memory / 2**30:.2f} GiB ({memory_source}): lower {param} if the "
                "estimate is high, use smaller members (fewer rows per member: more members), or "
                "fit them on CPUs (useGpu=False)"
            )
        if amount < 1 and round(1 / amount) > per_gpu:  # Spark would put more on a GPU than fit
            amount = 1.0 / per_gpu
    by_gpu = int(gpus_per_executor / amount + 1e-9)
    concurrency = max(1, executors * min(slots_per_executor, by_gpu))
    return GpuPlan(
        int(bytes_per_member), executors, slots_per_executor, gpus_per_executor, float(gpu_per_task or 1),
        gpu_memory, memory_source, amount, concurrency,
    )  # fmt: skip


def plan_gpu_members(
    spark, bytes_per_member: int, local_gpus: int = 0, param: str = "gpuMemoryPerMember"
) -> GpuPlan:
    """:func:`gpu_members` for ``spark``'s cluster (its configuration; on a local master, the
    driver's ``local_gpus``); logs the plan, and says so when the GPUs' memory is unknown."""
    from . import _spark_env

    cluster = ClusterMemory.from_spark(spark)
    conf = _spark_env.conf_of(spark)
    local = _spark_env.local_master(spark)
    if local:
        gpus_per_executor = local_gpus
        per_task = 1.0 / max(1, -(-cluster.slots_per_executor // max(1, gpus_per_executor)))
    else:
        gpus_per_executor = int(float(conf("spark.executor.resource.gpu.amount", "0") or 0))
        per_task = float(conf("spark.task.resource.gpu.amount", "0") or 0) or 1.0
    memory = gpu_bytes(spark, on_this_machine=local)
    source = memory[1] if memory else f"set {GPU_MEMORY_CONF}, e.g. '80g', to check it"
    p = gpu_members(
        cluster.executors, cluster.slots_per_executor, gpus_per_executor, per_task,
        memory[0] if memory else None, bytes_per_member, source, param,
    )  # fmt: skip
    (log.info if p.memory_known else log.warning)("useGpu: %s", p.summary())
    return p
