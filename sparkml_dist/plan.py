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

Example::

    from sparkml_dist.plan import model_bytes, plan_concurrency

    need = model_bytes(net, precision="fp32", backprop=True, batch_size=32)
    p = plan_concurrency(spark, need)
    print(p.summary())     # "2 executors x min(4 slots, 12 models) = 8 models at once ..."
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ._spark_env import ClusterMemory
from .errors import ConfigurationError, InsufficientResourcesError

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
