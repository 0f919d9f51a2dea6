"""Scoring a DataFrame with a model across the cluster: ``predict_batch``.  [driver]

The semantics of pyspark's ``predict_batch_udf``, without its pandas round trip: the input columns
go from Arrow straight to numpy, batch by batch, through a predict function made **once per Python
worker** (Spark reuses workers between tasks, so a model is loaded once per worker, not per task or
batch), and the predictions come back as one new column::

    from sparkml_dist.inference import predict_batch

    def make_predict_fn():                       # runs once per Python worker
        net = torch_models.load("/dbfs/models/net", builder=make_net)
        def predict(features):                   # (b, d) float array in
            with torch.no_grad():
                return net(torch.from_numpy(features).float()).numpy()   # (b,) or (b, k) out
        return predict

    scored = predict_batch(df, make_predict_fn, input_cols=["features"], return_type="array<float>")

or with a fitted scikit-learn-API model (sent to the executors in a safe format and decoded once per
worker; nothing is unpickled), or a fitted or saved ensemble (its directory, loaded on the driver
with the same checks as ``load``; it scores with its own transform, members decoded once per
worker, ``return_type`` being its own: double labels, or probabilities as ``array<double>``)::

    predict_batch(df, model=fitted_sklearn_model, input_cols=["f0", "f1"])
    predict_batch(df, model="/dbfs/models/bagging", input_cols=["f0", "f1"], method="predict_proba",
                  return_type="array<double>")

**Features matched by name.**  A model that knows the names of the features it was fitted on
(scikit-learn's ``feature_names_in_``, XGBoost's ``feature_names``, an ensemble's ``featuresCols``)
gets the columns of ``input_cols`` in *its* order, whatever order they are given in; a name it needs
that ``input_cols`` lacks, or one it does not know, is refused before any job.  A model without
names (fitted on a numpy array) gets the columns in the order given, as does one array or vector
column.  No feature-name warning is printed per batch.

The predict function gets one numpy array per input column: (b,) for a scalar column, (b, d) for an
array or ``VectorUDT`` column (converted with ``vector_to_array``), objects (``bytes``/``str``) for
binary and string columns; it returns an array of ``b`` values (``return_type`` a number type, the
default ``double``), ``(b, k)`` (an array type), or a dict of arrays (a struct type).  ``use_gpu``:
each task asks one GPU on a cluster that schedules them and the predict function sees only its
task's GPUs (``CUDA_VISIBLE_DEVICES``) — not yet run on a GPU.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Optional, Sequence, Union

import pyarrow as pa

from . import arg_checks
from ._predict_worker import PredictSpec, model_key, predict_task
from .errors import ConfigurationError


def _spark_type(return_type):
    from pyspark.sql.types import DataType, _parse_datatype_string

    if isinstance(return_type, DataType):
        return return_type
    try:
        return _parse_datatype_string(str(return_type))
    except Exception as exc:  # noqa: BLE001 - pyspark raises several parse errors
        raise ConfigurationError(
            f"return_type={return_type!r} is not a Spark type (e.g. 'double', 'array<float>', "
            f"'struct<label:int,score:double>'): {exc}"
        ) from exc


def _arrow_field(name: str, dtype) -> pa.Field:
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return pa.field(name, to_arrow_type(dtype))
    except TypeError as exc:
        raise ConfigurationError(f"return_type {dtype.simpleString()} has no Arrow form: {exc}") from exc


def _inputs(df, input_cols: Sequence[str]):
    """``df`` with the input columns checked (vectors as arrays); raises naming a bad column."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import types as T

    if isinstance(input_cols, str) or not input_cols:
        raise ConfigurationError("input_cols must be a non-empty list of column names, e.g. ['features']")
    fields = {f.name: f.dataType for f in df.schema.fields}
    for c in input_cols:
        if c not in fields:
            raise ConfigurationError(f"input column {c!r} is not in the DataFrame; it has {sorted(fields)}")
        t = fields[c]
        if t.simpleString() == "vector":
            df = df.withColumn(c, vector_to_array(c))
            continue
        inner = t.elementType if isinstance(t, T.ArrayType) else t
        if not isinstance(inner, (T.NumericType, T.BooleanType, T.BinaryType, T.StringType)) or (
            isinstance(t, T.ArrayType) and not isinstance(inner, (T.NumericType, T.BooleanType))
        ):
            raise ConfigurationError(
                f"input column {c!r} is {t.simpleString()}: predict_batch takes numbers, arrays of "
                "numbers, vectors, binary or strings; convert it first (e.g. with a cast or to_json)"
            )
    return df


def _ensemble(model: Any):
    """A saved ensemble's directory, or an ensemble / grouped model, as the stage; else None."""
    from .ensemble.models import BaggingModel

    if isinstance(model, str):
        from .ensemble.stored.persistence import load_stage

        return load_stage(model)
    return model if isinstance(model, BaggingModel) else None


def _ensemble_scores(df, stage, input_cols, output_col: str, method: str):
    """An ensemble's own transform (members decoded safely once per worker) into ``output_col``."""
    from pyspark.ml.functions import vector_to_array

    if method not in ("predict", "predict_proba"):
        raise ConfigurationError(f"method={method!r}: an ensemble scores with 'predict' or 'predict_proba'")
    if method == "predict_proba" and not stage.hasParam("probabilityCol"):
        raise ConfigurationError("method='predict_proba' needs a classifier ensemble")
    m = stage.copy()
    one = len(input_cols) == 1 and df.schema[input_cols[0]].dataType.simpleString().startswith(
        ("array", "vector")
    )
    m.set(m.featuresCol, input_cols[0] if one else m.getFeaturesCol())
    m.set(m.featuresCols, [] if one else list(input_cols))
    tmp = "__sd_proba"
    m.set(m.predictionCol, output_col if method == "predict" else "")
    for name in ("probabilityCol", "rawPredictionCol"):
        if m.hasParam(name):
            m.set(m.getParam(name), tmp if method == "predict_proba" and name == "probabilityCol" else "")
    out = m.transform(df)
    return out.withColumn(output_col, vector_to_array(tmp)).drop(tmp) if method == "predict_proba" else out


def feature_names(model: Any) -> Optional[list]:
    """The names of the features ``model`` was fitted on, in its order, if it knows them:
    scikit-learn's ``feature_names_in_``, XGBoost's booster ``feature_names``, a bagging or grouped
    model's ``featuresCols``."""
    names = getattr(model, "feature_names_in_", None)
    if names is None and hasattr(model, "get_booster"):
        try:
            names = model.get_booster().feature_names
        except Exception:  # noqa: BLE001 - an unfitted or foreign model: no names
            names = None
    if names is None and type(model).__name__ == "Booster":
        names = getattr(model, "feature_names", None)
    if names is None and hasattr(model, "getFeaturesCols"):
        names = model.getFeaturesCols() or None
    return [str(n) for n in names] if names is not None else None


def matched_columns(df, input_cols: Sequence[str], names: Optional[Sequence[str]], what: str) -> list:
    """``input_cols`` in the order of the model's feature ``names`` (see the module docstring)."""
    cols = list(input_cols)
    if names is None:
        return cols
    if len(cols) == 1 and df.schema[cols[0]].dataType.simpleString().startswith(("array", "vector")):
        return cols  # one column holds every feature: its order is the model's to know
    missing = [n for n in names if n not in cols]
    extra = [c for c in cols if c not in names]
    if missing or extra or len(cols) != len(names):
        raise ConfigurationError(
            f"{what} was fitted on the features {list(names)} (in that order); input_cols={cols} "
            + (f"lacks {missing}" if missing else "")
            + (" and " if missing and extra else "")
            + (f"has {extra}, which it does not know" if extra else "")
            + ". Name the same columns (in any order: they are matched by name)."
        )
    return list(names)


def _function_spec(make_predict_fn: Callable) -> dict:
    from . import serialization

    blob = serialization.travelling(make_predict_fn, "make_predict_fn", make_predict_fn)
    return dict(make_fn=blob, key=uuid.uuid4().hex)


def _model_spec(model: Any, method: str, trusted_types: Sequence[str]) -> dict:
    if not callable(getattr(model, method, None)):
        raise ConfigurationError(
            f"model={type(model).__name__} has no {method}() method: pass a fitted scikit-learn-API "
            "model, a saved ensemble's directory, or make_predict_fn"
        )
    from .formats import encode

    fmt, data = encode(model)
    return dict(model_format=fmt, model_bytes=data, key=model_key(fmt, data, {"method": method}))


def predict_batch(
    df,
    make_predict_fn: Optional[Callable[[], Callable]] = None,
    *,
    input_cols: Sequence[str],
    return_type: Union[str, Any] = "double",
    output_col: str = "prediction",
    batch_size: int = 1024,
    model: Any = None,
    method: str = "predict",
    use_gpu: bool = False,
    trusted_types: Sequence[str] = (),
):
    """``df`` with ``output_col`` added: the predictions of ``make_predict_fn()``'s function (or of
    ``model``'s ``method``) for every row, ``batch_size`` rows per call.  Lazy, as a DataFrame
    transformation: nothing runs until an action.  See the module docstring."""
    if (make_predict_fn is None) == (model is None):
        raise ConfigurationError("predict_batch: give make_predict_fn or model=, not both")
    if make_predict_fn is not None and not callable(make_predict_fn):
        raise ConfigurationError("make_predict_fn must be a function returning the predict function")
    arg_checks.integer("batch_size", batch_size, 1)
    if output_col in df.columns:
        raise ConfigurationError(f"output_col={output_col!r} is already a column; choose another name")
    df = _inputs(df, input_cols)
    stage = _ensemble(model) if model is not None else None
    if model is not None:
        input_cols = matched_columns(
            df,
            input_cols,
            feature_names(stage if stage is not None else model),
            f"model={type(model).__name__}",
        )
    if stage is not None:
        return _ensemble_scores(df, stage, list(input_cols), output_col, method)
    dtype = _spark_type(return_type)
    field = _arrow_field(output_col, dtype)
    where = _function_spec(make_predict_fn) if model is None else _model_spec(model, method, trusted_types)
    spec = PredictSpec(
        input_cols=tuple(input_cols),  # checked by _inputs
        output_col=output_col,
        output_type=pa.schema([field]).serialize().to_pybytes(),
        batch_size=int(batch_size),
        use_gpu=bool(use_gpu),
        method=method,
        trusted_types=tuple(trusted_types),
        **where,
    )
    from pyspark.sql.types import StructField, StructType

    schema = StructType([*df.schema.fields, StructField(output_col, dtype, True)])

    def task(batches):
        return predict_task(batches, spec)

    if use_gpu:
        return _with_gpu(df, task, schema)
    return df.mapInArrow(task, schema)


def _with_gpu(df, task, schema):
    """One GPU per scoring task where the cluster schedules GPUs (a stage-level profile)."""
    from .gpus import rank_profile

    profile = rank_profile(df.sparkSession, True)
    if profile is None:
        return df.mapInArrow(task, schema)
    return df.mapInArrow(task, schema, profile=profile)
