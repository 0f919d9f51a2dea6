"""sparkml_dist: distributed training on the Spark cluster that already holds your data.  [anywhere]

* :mod:`sparkml_dist.ensemble` - one scikit-learn-API model per group of rows (bagging), as
  pyspark.ml Estimators.
* :mod:`sparkml_dist.runner` - data-parallel PyTorch training in barrier mode (BarrierRunner).
* :mod:`sparkml_dist.formats.networks` and :mod:`sparkml_dist.inference` - a trained network saved
  safely (safetensors + JSON) and any model scoring a DataFrame (``predict_batch``).
* :mod:`sparkml_dist.partitioning` and :mod:`sparkml_dist.collection` - the shared split of rows
  into groups and the shared way back for fitted objects.

Every module, where it runs and what it holds: the module map in docs/design.md.

Importing this package needs neither torch nor horovod.
"""

from .errors import (
    CollectionError,
    ConfigurationError,
    InsufficientResourcesError,
    RunTimeoutError,
    SparkMLDistError,
    WorkerError,
)

__version__ = "0.1.0"

# public modules under their earlier top-level names (the package's rooms moved them), loaded on use:
# ``from sparkml_dist import torch_models`` goes on working
_MOVED = {
    "torch_models": "sparkml_dist.formats.networks",
    "model_formats": "sparkml_dist.formats",
    "model_store": "sparkml_dist.formats.store",
    "model_checks": "sparkml_dist.formats.checks",
    "safe_files": "sparkml_dist.formats.files",
}


def __getattr__(name):
    target = _MOVED.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(target)
    globals()[name] = module
    return module


__all__ = [
    "SparkMLDistError",
    "ConfigurationError",
    "InsufficientResourcesError",
    "WorkerError",
    "CollectionError",
    "RunTimeoutError",
    "__version__",
]
