"""Your own training function per group of rows: ``train_per_group``.  [driver]

The plainest distributed pattern (``mapPartitions`` with your own code): ``fn(data, key)`` runs
inside the executors once per group, on all of that group's rows, and returns a fitted model, or
``(model, {"metric": value, ...})``::

    from sparkml_dist.ensemble import train_per_group

    def fit(data, key):                           # data: a pandas DataFrame of the group's rows
        model = LogisticRegression().fit(data[["x1", "x2"]], data["label"])
        return model, {"train_acc": model.score(data[["x1", "x2"]], data["label"])}

    result = train_per_group(df, fit, group_col="store")            # one model per store
    result = train_per_group(df, fit, num_groups=8, sampling="bootstrap", sample_ratio=0.5, seed=7)
    result.members[0].model, result.members[0].metrics, result.skipped
    result.to_table().write.parquet("models/")    # (group, rows, format, model, metrics, ...)

Groups come from a column's values (``group_col``: one group per distinct non-null key, grouped in
Spark: a timestamp, a float, an array key finds all of its rows) or from the shared partitioning
layer (``num_groups`` + ``sampling`` / ``sample_ratio`` / ``seed``: the same groups
:class:`BaggingClassifier` deals for the same ``features_cols``, ``label_col``, seed and rows).
With ``features_cols``, ``fn`` gets ``(X, y)`` instead of a DataFrame: ``X`` the feature columns
stacked (sparse vector columns stay sparse: ``X`` is then a ``scipy.sparse.csr_matrix``), ``y``
the ``label_col`` values.  A group's rows come in a fixed order (by a hash of the seed and the
row), and ``random`` / ``numpy.random`` are seeded with the group's own seed before ``fn`` runs, so
a retried task or another cluster shape calls ``fn`` the same way.

``members_dir`` (storage the executors and the driver share): each task writes its group's model
there in a safe format and sends back only the file's name and SHA-256, so the driver never holds
the models (``member.model`` reads one when asked).  ``resources={"cpus": c, "gpus": g}`` (or
``use_gpu=True``, one GPU): what each task asks of a cluster master (a stage-level profile; ``fn``
finds its GPUs with ``TaskContext.get().resources()["gpu"].addresses``); local masters schedule no
task resources.

A group whose ``fn`` raises fails the call with a ``WorkerError`` naming the key and carrying the
traceback (``on_error="raise"``), or is listed in ``skipped`` with its error (``on_error="skip"``;
the members table keeps its row, with the reason).  ``key_timeout`` (seconds) bounds each group's
``fn``: one running longer is stopped (each task then calls ``fn`` in a child process it kills,
:mod:`.engine.key_watch`) and fails the same way.  ``stream=True``: ``fn(batches, key)`` gets an
iterator of the group's rows as Arrow record batches, read as Spark reads them, so a group larger
than a task's memory trains (:mod:`.engine.stream`; what ``fn`` leaves unread is skipped).
The camelCase spellings of earlier releases (``groupCol=``, ``numGroups=``, ...) still work, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa

from .. import arg_checks, launch, partitioning
from .. import gpus as gpus_mod
from ..errors import ConfigurationError
from ..group_rows import SeedDraw
from .engine import groups, key_counts
from .engine.fitting import Function, GroupFitSpec, Inputs
from .group_models import GroupMember, GroupModels
from .member_records import FEATURES, LABEL
from .stored import member_store
from .stored.key_models import KeyModels

__all__ = ["GroupMember", "GroupModels", "train_per_group"]

log = logging.getLogger(__name__)


def _payload(fn: Callable) -> bytes:
    from .. import serialization

    if not callable(fn):
        raise ConfigurationError(f"fn must be a function fn(data, key), got {type(fn).__name__}")
    return serialization.travelling(fn, "fn", fn)


def _check_columns(df, features: Sequence[str], label: Optional[str]) -> None:
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    for c, param in [(c, "features_cols") for c in features] + ([(label, "label_col")] if label else []):
        if c not in fields:
            raise ConfigurationError(
                f"{param}: column {c!r} is not in the DataFrame; it has {sorted(fields)}"
            )
    for c in features:
        t = fields[c]
        ok = isinstance(t, T.NumericType) or t.simpleString() == "vector"
        ok = ok or (isinstance(t, T.ArrayType) and isinstance(t.elementType, T.NumericType))
        if not ok:
            raise ConfigurationError(
                f"features_cols: column {c!r} is {t.simpleString()}; expected numbers, arrays of numbers "
                "or vectors. Encode it first, or leave features_cols unset to get a pandas DataFrame"
            )


def _by_split(df, spec, features: Sequence[str], label: Optional[str], columns: List[str]) -> groups.Groups:
    """Groups from the shared partitioning layer, keyed as bagging keys rows when the features are
    numeric columns (the same groups), else by every hashable column."""
    from pyspark.sql import types as T

    from .validation import features_column, numeric_column

    numeric = features and all(isinstance(df.schema[c].dataType, T.NumericType) for c in features)
    if numeric and label:
        keyed = df.withColumns(
            {FEATURES: features_column(df, "", list(features)), LABEL: numeric_column(df, label, "label_col")}
        )
        key_cols = [FEATURES, LABEL]
    else:
        keyed, key_cols = df, partitioning.hashable_columns(df)
    return groups.by_split(keyed, spec, key_cols, columns)


def _split(
    df, group_col, num_groups, sampling, sample_ratio, seed, features, label, columns, stream=False
) -> groups.Groups:
    """The groups: by ``group_col``'s values, or by the shared split."""
    if group_col is not None:
        counts = key_counts.count_keys(df, group_col, param="group_col")
        per_row = max(1, len(df.columns)) * 8
        return groups.by_key(
            df, counts, columns, seed=seed, bytes_per_row=per_row, held_rows=0 if stream else None
        )
    spec = partitioning.SplitSpec(
        num_groups=arg_checks.integer("num_groups", num_groups, 1),
        sampling=sampling,
        sample_ratio=sample_ratio,
        seed=seed,
        names={"num_groups": "num_groups", "sampling": "sampling", "sample_ratio": "sample_ratio"},
    )
    return _by_split(df, spec, features, label, columns)


_RENAMED = {
    "groupCol": "group_col",
    "numGroups": "num_groups",
    "sampleRatio": "sample_ratio",
    "featuresCols": "features_cols",
    "labelCol": "label_col",
    "onError": "on_error",
    "membersDir": "members_dir",
}


def _renamed(given: Dict[str, Any]) -> Dict[str, Any]:
    """The earlier camelCase keywords under their names now, each with a DeprecationWarning."""
    import warnings

    out = {}
    for old, value in given.items():
        new = _RENAMED.get(old)
        if new is None:
            raise TypeError(f"train_per_group() got an unexpected keyword argument {old!r}")
        warnings.warn(
            f"train_per_group({old}=...) is now {new}=...; the old name goes in a later release",
            DeprecationWarning,
            stacklevel=4,
        )
        out[new] = value
    return out


def train_per_group(
    df,
    fn: Callable,
    *,
    group_col: Optional[str] = None,
    num_groups: Optional[int] = None,
    sampling: str = "disjoint",
    sample_ratio: float = 1.0,
    features_cols: Optional[Sequence[str]] = None,
    label_col: Optional[str] = "label",
    seed: int = 0,
    on_error: str = "raise",
    members_dir: Optional[str] = None,
    resources: Optional[Dict[str, int]] = None,
    use_gpu: bool = False,
    key_timeout: Optional[float] = None,
    stream: bool = False,
    **renamed: Any,
) -> GroupModels:
    """``fn(data, key)`` on every group of ``df``'s rows inside the executors; see the module
    docstring.  Returns a :class:`GroupModels`.

    >>> result = train_per_group(df, fit, group_col="store")     # doctest: +SKIP
    >>> result["north"].model, result["north"].metrics           # doctest: +SKIP
    """
    if renamed:  # the camelCase spellings of earlier releases
        given = dict(
            group_col=group_col, num_groups=num_groups, sample_ratio=sample_ratio,
            features_cols=features_cols, label_col=label_col, on_error=on_error, members_dir=members_dir,
        )  # fmt: skip
        return train_per_group(df, fn, sampling=sampling, seed=seed, resources=resources,
                               use_gpu=use_gpu, key_timeout=key_timeout, stream=stream,
                               **{**given, **_renamed(renamed)})  # fmt: skip
    if (group_col is None) == (num_groups is None):
        raise ConfigurationError(
            "train_per_group: give group_col (a column's values) or num_groups, not both"
        )
    arg_checks.one_of("on_error", on_error, ("raise", "skip"))
    arg_checks.seconds("key_timeout", key_timeout, fix="seconds one group's fn may take, or None")
    blob = _payload(fn)
    spark = launch.session_of(df)
    if use_gpu:
        resources = {**(resources or {}), "gpus": max(1, (resources or {}).get("gpus", 0))}
    profile = gpus_mod.resources_profile(spark, resources, "resources")
    store = member_store.new_store(members_dir, "per_group")
    features = list(features_cols or [])
    label = label_col if features and label_col else None
    _check_columns(df, features, label)
    columns = features + ([label] if label else []) if features else list(df.columns)
    split = _split(df, group_col, num_groups, sampling, sample_ratio, seed, features, label, columns, stream)
    inputs = Inputs(features=tuple(features), label=label, keep_sparse=True)
    fit_id = uuid.uuid4().hex
    spec = GroupFitSpec(Function(blob, SeedDraw(seed, split.n)), inputs, split.keys, on_error, store,
                        blocks=(fit_id, split.n, _fold_state(split)), key_timeout=key_timeout,
                        stream="all" if stream else None)  # fmt: skip
    try:
        return _fitted(split, spec, profile, spark)
    finally:  # the split's and the collection's objects, freed: their heap back to the system
        del split, spec
        launch.give_back_memory()


def _fold_state(split: groups.Groups) -> dict:
    """What each block row's record keeps of the fit: the keys' collation, when not byte for byte."""
    fold = split.counts.fold if split.counts is not None else None
    return {"key_fold": fold} if fold else {}


def _fitted(split: groups.Groups, spec: GroupFitSpec, profile, spark) -> GroupModels:
    """Every group's ``fn`` in one job, the models in blocks (:func:`groups.fit_keys`)."""
    fitted = groups.fit_keys(
        split, spec, what="group", description=f"sparkml_dist: training {split.n} groups", profile=profile
    )
    keys = split.key_array if split.counts is not None else pa.array(np.arange(split.n))
    uri = spec.store.uri if spec.store is not None else None
    fold = split.counts.fold if split.counts is not None else None
    models = KeyModels(keys, fitted.rows, fitted.blocks, spec.blocks[0], uri, fold=fold)
    return GroupModels(models, {split.key(i): why for i, why in fitted.failed.items()}, spark)
