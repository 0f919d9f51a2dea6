"""GPUs for bagging members: each fitted on a GPU of its task.  [anywhere]

An estimator that can use a GPU says so with a ``device`` parameter (XGBoost's ``device="cuda:0"``,
skorch's ``device``).  With ``useGpu=True`` the driver refuses, before any job, an estimator
without one, and plans where GPUs come from, as the runner does: on a cluster that schedules GPUs
each fitting task asks one through a stage-level profile (unless ``spark.task.resource.gpu.amount``
already gives it one); on a local master (where Spark gives tasks no GPUs) the driver's GPUs are
dealt to the members by group number.  On the executor :func:`place` sets the member's ``device``
to its GPU, so the fitted member says which GPU it used (``get_params()["device"]``).

Example::

    gpus, profile = plan(spark, estimator, True, "useGpu")     # driver
    place(model, gpus, group)                                  # executor, before fit
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from .errors import ConfigurationError, InsufficientResourcesError
from .gpus import local as local_gpus
from .gpus import rank_profile, task_addresses


def _has_device(estimator: Any) -> bool:
    try:
        return "device" in estimator.get_params(deep=False)
    except Exception:  # noqa: BLE001 - not a scikit-learn-API estimator: it has no device to set
        return False


def plan(spark, estimator: Any, use_gpu: bool, param: str) -> Tuple[Optional[Tuple[str, ...]], Any]:
    """``(gpus, profile)`` for the fitting tasks: ``gpus`` None without GPUs, ``()`` for the
    task's own GPU (a cluster), else the driver's GPUs to deal; ``profile`` a stage-level
    ResourceProfile or None."""
    if not use_gpu:
        return None, None
    if not _has_device(estimator):
        raise ConfigurationError(
            f"{param}=True but {type(estimator).__name__} has no 'device' parameter to put it on a GPU; "
            "use an estimator that takes one (XGBoost: XGBClassifier/XGBRegressor), or set "
            f"{param}=False"
        )
    from . import _spark_env

    if _spark_env.is_local(_spark_env.master_of(spark)):
        gpus, _ = local_gpus(spark)
        if not gpus:
            raise InsufficientResourcesError(
                f"{param}=True but this machine shows no GPU (spark.driver.resource.gpu, "
                "CUDA_VISIBLE_DEVICES or torch.cuda); set it to False"
            )
        return tuple(gpus), None
    return (), rank_profile(spark, True)


def place(model: Any, gpus: Sequence[str], group: int) -> str:
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
