"""sparkml_dist ensemble and grouped models as MLflow models (the ``sparkml_dist`` flavor).  [anywhere]

A model is saved in the package's own format (:mod:`sparkml_dist.ensemble.stored.persistence`: JSON
records, members in skops / XGBoost formats, SHA-256 manifest), with an ``MLmodel`` file naming the
flavors ``sparkml_dist`` and ``python_function`` (whose loader is this module) and, when logged
from classic Spark, ``spark`` (the model as a one-stage PipelineModel, for
``mlflow.spark.load_model``; the other flavors read the same stage directory).  So
``mlflow.pyfunc.load_model(uri)`` loads it *without unpickling anything* (MLflow's usual Python
models are cloudpickles, which run code when loaded) and without a Spark session, and ``predict``
takes a pandas DataFrame:

* bagging models: the feature columns (``featuresCols``, else every column, in order) -> the
  ensemble's predictions, the same numbers as ``model.transform`` and ``model.predict``;
* grouped models: the feature columns and the ``groupCol`` column -> each row's key's model.

Hostile model directories: the ``stage`` path an ``MLmodel`` names must be the flavor's own
(``stage`` or ``sparkml/stages/<name>``, inside the model directory), and when a signing key is set
(``SPARKML_DIST_MODEL_KEY``) saving also writes ``MLmodel.sig`` (HMAC-SHA256 of ``MLmodel``) and
loading refuses an ``MLmodel`` whose signature is missing or wrong, as it refuses the stage's store.
``mlflow.pyfunc.load_model`` imports the ``loader_module`` an ``MLmodel`` names *before* any code
of ours runs: for directories from elsewhere, load with :func:`load_model` (which reads ``MLmodel``
itself, checks it, and imports nothing it names).

Networks trained with the runner (:mod:`sparkml_dist.formats.networks`: safetensors + JSON) are logged
with :func:`log_network` under the same flavor (``kind: network``); the pyfunc feeds the frame's
columns (list columns spread) to the network as one float32 tensor and returns its output.  The
network is rebuilt by the builder its ``model.json`` names only when the loader is allowed to call
it: listed in ``SPARKML_DIST_TRUSTED_BUILDERS`` (comma separated ``module:name``), or the files
signed with ``SPARKML_DIST_MODEL_KEY``; :func:`load_network` takes ``builder=`` directly.

Example::

    from sparkml_dist import mlflow_flavor
    mlflow_flavor.log_network(net, run_id, builder=make_net, builder_kwargs={"hidden": 64})
    mlflow_flavor.log_model(model, run_id)                  # what a tracked fit does itself
    loaded = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    loaded.predict(pdf)
    mlflow_flavor.load_model(f"runs:/{run_id}/model")       # the pyspark.ml Model again (transform)
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from .formats.mlflow import (  # noqa: F401 - the writer's half, here for the API
    FLAVOR,
    NETWORK_DIR,
    SIGNATURE,
    SPARK_DIR,
    STAGE_DIR,
    log_model,
    log_network,
    save_model,
    save_network,
)

TRUSTED_BUILDERS_ENV = "SPARKML_DIST_TRUSTED_BUILDERS"
_STAGE = re.compile(rf"({STAGE_DIR}|{NETWORK_DIR}|{SPARK_DIR}/stages/[A-Za-z0-9][A-Za-z0-9_.-]{{0,200}})")


def _verify(root: str) -> None:
    from .formats import UnsafeModelError
    from .formats.files import read_regular
    from .formats.mlflow import mlmodel_mac
    from .formats.signing import KEY_ENV, key_bytes, same

    key = key_bytes(None)
    if key is None:
        return
    sig = read_regular(os.path.join(root, SIGNATURE), 4096, f"{SIGNATURE} of {root!r}")
    try:
        mac = json.loads(sig.decode())["mac"] if sig is not None else None
    except (ValueError, KeyError, TypeError):
        mac = ""
    if mac is None:
        raise UnsafeModelError(f"the MLflow model {root!r} is not signed, and {KEY_ENV} is set: refused")
    if not same(mac, mlmodel_mac(key, root)):
        raise UnsafeModelError(f"the MLmodel of {root!r} does not match its signature: refused")


def _stage_path(root: str, stage: Any) -> str:
    """``root/stage``, once ``stage`` is the flavor's own kind of path inside ``root``."""
    from .formats.files import checked_name

    checked_name(stage, _STAGE, f"the MLmodel of {root!r}")
    path = os.path.realpath(os.path.join(root, stage))
    if not path.startswith(os.path.realpath(root) + os.sep):
        checked_name(None, _STAGE, f"the MLmodel of {root!r}")  # a link out of the directory
    return path


def _read_stage(root: str, stage: Any):
    from .ensemble.stored.persistence import load_stage

    _verify(root)
    path = _stage_path(root, stage)
    if stage == NETWORK_DIR:
        return _network(path)
    return load_stage(path)


def _network(path: str, builder: Any = None):
    """The network of an MLflow model's ``network`` directory, rebuilt by ``builder`` or by the
    builder its record names when trusted (``SPARKML_DIST_TRUSTED_BUILDERS``, or signed files)."""
    from .formats import networks as torch_models
    from .formats.store import key_bytes

    if builder is not None:
        return torch_models.load(path, builder)
    allowed = [n.strip() for n in os.environ.get(TRUSTED_BUILDERS_ENV, "").split(",") if n.strip()]
    if key_bytes(None) is not None:  # the signed record's builder was written by a key holder
        allowed.append(torch_models.read_meta(path)["builder"])
    try:
        return torch_models.load(path, allowed=allowed)
    except torch_models.UnsafeModelError as exc:
        raise torch_models.UnsafeModelError(
            f"{exc}; for MLflow's loader list it in {TRUSTED_BUILDERS_ENV}, or sign the model "
            "(SPARKML_DIST_MODEL_KEY), or call mlflow_flavor.load_network(uri, builder=...)"
        ) from None


def _local_root(model_uri: str):
    """(local directory, the flavor's stage path) of a logged model; nothing ``MLmodel`` names is imported."""
    import mlflow.artifacts
    import yaml

    from .formats import UnsafeModelError
    from .formats.files import read_regular

    local = mlflow.artifacts.download_artifacts(model_uri)
    text = read_regular(os.path.join(local, "MLmodel"), 1 << 20, f"the MLmodel of {model_uri!r}")
    conf = yaml.safe_load(text) if text is not None else None
    try:
        return local, conf["flavors"][FLAVOR]["stage"]
    except (TypeError, KeyError):
        raise UnsafeModelError(f"{model_uri!r} has no MLmodel naming a {FLAVOR} flavor") from None


def load_network(model_uri: str, builder: Any = None):
    """The ``torch.nn.Module`` logged at ``model_uri`` by :func:`log_network`, rebuilt by
    ``builder`` (or a trusted builder, see the module docstring)."""
    from .formats import UnsafeModelError

    local, stage = _local_root(model_uri)
    _verify(local)
    if stage != NETWORK_DIR:
        raise UnsafeModelError(f"{model_uri!r} holds no network (its stage is {stage!r}): use load_model")
    return _network(_stage_path(local, stage), builder)


def load_model(model_uri: str) -> Any:
    """The pyspark.ml model (``BaggingClassificationModel``, ``GroupedModel``...) logged at
    ``model_uri``: ``MLmodel`` is read as YAML data (nothing it names is imported), its stage path
    checked, and its signature verified when ``SPARKML_DIST_MODEL_KEY`` is set."""
    return _read_stage(*_local_root(model_uri))


class PyFuncModel:
    """What ``mlflow.pyfunc.load_model`` wraps: ``predict(pandas DataFrame) -> numpy array``."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage

    def predict(self, model_input, params=None) -> np.ndarray:
        import pandas as pd

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        stage = self.stage
        if _is_network(stage):
            return _network_predict(stage, frame)
        if hasattr(stage, "getGroupCol"):
            key = stage.getGroupCol()
            if key not in frame.columns:
                raise ValueError(f"the input has no {key!r} column (groupCol): it selects each row's model")
            cols = stage.getFeaturesCols() or [c for c in frame.columns if c != key]
            return stage.predict(frame[list(cols)].to_numpy(dtype=np.float64), frame[key].tolist())
        return stage.predict(frame)


def _load_pyfunc(path: str) -> PyFuncModel:
    """MLflow's pyfunc entry point (``loader_module``): ``path`` is the model's ``stage`` directory,
    inside the model directory that holds ``MLmodel`` (found by walking up)."""
    from .formats import UnsafeModelError

    root = os.path.dirname(os.path.abspath(path))
    for _ in range(3):
        if os.path.exists(os.path.join(root, "MLmodel")):
            return PyFuncModel(_read_stage(root, os.path.relpath(os.path.abspath(path), root)))
        root = os.path.dirname(root)
    raise UnsafeModelError(f"{path!r} is not inside an MLflow model directory (no MLmodel above it)")


def _is_network(stage: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(stage, torch.nn.Module)


def _network_predict(net: Any, frame) -> np.ndarray:
    """The frame's columns (list columns spread) as one float32 tensor through ``net``."""
    import torch

    parts = [
        np.stack(frame[c].to_numpy()) if frame[c].dtype == object else frame[c].to_numpy()[:, None]
        for c in frame.columns
    ]
    x = torch.from_numpy(np.concatenate(parts, axis=1).astype(np.float32, copy=False))
    with torch.no_grad():
        return net(x).numpy()
