"""Writing ensemble, grouped and network models as MLflow models (the ``sparkml_dist`` flavor).  [anywhere]

The writer half of :mod:`sparkml_dist.mlflow_flavor` (which reads them back, and is the
``loader_module`` every ``MLmodel`` names): :func:`save_model` / :func:`log_model` write a fitted
stage through its own ``write()`` (no import of the ensemble package: any stage with
``write()`` is written the same way), :func:`save_network` / :func:`log_network` a network through
:mod:`sparkml_dist.formats.networks`; with a signing key (``SPARKML_DIST_MODEL_KEY``) the
``MLmodel`` file is signed (``MLmodel.sig``).  :mod:`sparkml_dist.tracking` logs a tracked fit's
model through here.

Example::

    from sparkml_dist.formats import mlflow as mlflow_writer
    mlflow_writer.log_model(model, run_id)             # runs:/<run_id>/model
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from typing import Any, Optional

from . import signing

FLAVOR = "sparkml_dist"
LOADER = "sparkml_dist.mlflow_flavor"  # what every MLmodel names as its pyfunc loader: never renamed
STAGE_DIR = "stage"
SPARK_DIR = "sparkml"
NETWORK_DIR = "network"
SIGNATURE = "MLmodel.sig"


def _spark_flavor(model: Any, path: str) -> Optional[str]:
    """On classic Spark, ``model`` as a one-stage PipelineModel in ``path/sparkml`` (MLflow's spark
    flavor, for ``mlflow.spark.load_model``); returns the stage's directory inside it, which the
    other flavors share (one copy of the members).  None on Spark Connect or for lazy members."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    lazy = type(getattr(model, "_members", None)).__name__ == "LazyMembers"
    from .. import _spark_env

    if spark is None or _spark_env.is_connect(spark) or lazy:
        return None
    from pyspark.ml import PipelineModel

    PipelineModel(stages=[model]).write().save(os.path.join(path, SPARK_DIR))
    stages = glob.glob(os.path.join(path, SPARK_DIR, "stages", "*"))
    return os.path.relpath(stages[0], path) if len(stages) == 1 else None


def save_model(model: Any, path: str) -> None:
    """Write ``model`` (a fitted bagging or grouped model) as an MLflow model directory ``path``."""
    import mlflow.pyfunc
    import pyspark
    from mlflow.models import Model

    from .. import __version__

    os.makedirs(path, exist_ok=False)
    stage = _spark_flavor(model, path)
    if stage is None:
        stage = STAGE_DIR
        model.write().save(os.path.join(path, STAGE_DIR))
    mlmodel = Model()
    mlmodel.add_flavor(FLAVOR, stage=stage, stage_class=type(model).__name__, version=__version__)
    mlflow.pyfunc.add_to_model(mlmodel, loader_module=LOADER, data=stage)
    if stage != STAGE_DIR:
        mlmodel.add_flavor("spark", pyspark_version=pyspark.__version__, model_data=SPARK_DIR)
    mlmodel.save(os.path.join(path, "MLmodel"))
    _sign(path)
    import sklearn

    with open(os.path.join(path, "requirements.txt"), "w", encoding="utf-8") as fh:
        fh.write(f"sparkml_dist=={__version__}\nscikit-learn=={sklearn.__version__}\n")


def save_network(module: Any, path: str, *, builder, builder_kwargs: Optional[dict] = None) -> None:
    """Write a network (see :func:`sparkml_dist.formats.networks.save`) as an MLflow model directory."""
    import mlflow.pyfunc
    from mlflow.models import Model

    from .. import __version__
    from . import networks as torch_models

    os.makedirs(path, exist_ok=False)
    torch_models.save(os.path.join(path, NETWORK_DIR), module, builder=builder, builder_kwargs=builder_kwargs)
    mlmodel = Model()
    mlmodel.add_flavor(FLAVOR, stage=NETWORK_DIR, kind="network", version=__version__)
    mlflow.pyfunc.add_to_model(mlmodel, loader_module=LOADER, data=NETWORK_DIR)
    mlmodel.save(os.path.join(path, "MLmodel"))
    _sign(path)
    import torch

    with open(os.path.join(path, "requirements.txt"), "w", encoding="utf-8") as fh:
        fh.write(f"sparkml_dist=={__version__}\ntorch=={torch.__version__.split('+')[0]}\nsafetensors\n")


def _log(save: Any, run_id: str, artifact_path: str) -> str:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "model")
        save(local)
        MlflowClient().log_artifacts(run_id, local, artifact_path)
    return f"runs:/{run_id}/{artifact_path}"


def log_model(model: Any, run_id: str, artifact_path: str = "model") -> str:
    """Save ``model`` into the artifacts of MLflow run ``run_id``; returns its ``runs:/`` URI."""
    return _log(lambda local: save_model(model, local), run_id, artifact_path)


def log_network(
    module: Any, run_id: str, *, builder, builder_kwargs: Optional[dict] = None, artifact_path: str = "model"
) -> Optional[str]:
    """Log a network into MLflow run ``run_id`` (rank 0 writes in a distributed run; the others get
    None); returns its ``runs:/`` URI."""
    from . import networks as torch_models

    state = torch_models.full_state(module)  # a collective for FSDP2 and pipelines: every rank
    if state is None:
        return None
    return _log(
        lambda local: save_network(state, local, builder=builder, builder_kwargs=builder_kwargs),
        run_id,
        artifact_path,
    )


def mlmodel_mac(key: bytes, root: str) -> str:
    """The signature of ``root``'s ``MLmodel`` under ``key`` (what ``MLmodel.sig`` holds)."""
    with open(os.path.join(root, "MLmodel"), "rb") as fh:
        return signing.mac(fh.read(), key)


def _sign(root: str) -> None:
    """``MLmodel.sig`` beside ``MLmodel`` when a signing key is set (the stage's store is signed
    with the same key)."""
    key = signing.key_bytes(None)
    if key is not None:
        with open(os.path.join(root, SIGNATURE), "w", encoding="utf-8") as fh:
            json.dump({"alg": signing.ALG, "mac": mlmodel_mac(key, root)}, fh)
