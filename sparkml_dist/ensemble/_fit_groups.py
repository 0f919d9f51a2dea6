"""The one executor loop of every per-group trainer: each group's rows -> its fitted model.  [executor]

:func:`fit_groups` is the ``mapInArrow`` function of :func:`sparkml_dist.ensemble.groups.fit`.  A
task's rows arrive one group after another (``GROUP_COL``); for each group:

1. its rows are put in one fixed order, by their row key (``KEY_COL``, a hash of the seed and the
   row; ties, i.e. bootstrap copies of one row, by label and weight), so a group is fitted on the
   same rows in the same order on every retry, input partitioning and cluster shape;
2. they become what the recipe fits on (:class:`Inputs`): ``(X, y, w)`` with ``X`` the feature
   columns side by side (:func:`sparkml_dist.feature_arrays.stack`: Spark ML vectors stay sparse
   where the model takes it, or always for the user's function), or a pandas DataFrame of the
   group's columns;
3. the recipe fits: :class:`Clone` (an estimator cloned with the group's seed: a bagging member on
   its feature subset, or a key's model) or :class:`Function` (the user's ``fn(data, key)``, with
   ``random`` and ``numpy.random`` seeded with the group's seed);
4. one error policy (``on_error``: the group's error and traceback fail the fit, or it is listed as
   skipped) and one output: the result collected, or written to the ``membersDir`` store as the one
   member record (:mod:`.member_records`) with only its metadata sent back.

Nothing here touches a SparkSession.
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa

from .. import collection, feature_arrays, serialization
from .. import gpus as gpus_mod
from ..group_rows import GROUP_COL, KEY_COL, group_runs, order_rows
from .member_records import KeyModel, Member, write_member


@dataclass(frozen=True)
class Inputs:
    """How a group's rows become what the recipe gets.

    ``features`` (columns stacked into ``X``; empty: the recipe gets a pandas DataFrame of every
    column), ``label`` and ``weight`` (column names or None), ``n_features`` (the width every group
    must have), ``keep_sparse`` (vectors always as CSR, for the user's function; else CSR only
    where the model takes it and few entries are stored), ``check_values`` (None: no check; else
    whether NaN is allowed in vector features, which SQL could not check), ``what`` (how errors
    name the features).
    """

    features: Tuple[str, ...] = ()
    label: Optional[str] = None
    weight: Optional[str] = None
    n_features: Optional[int] = None
    keep_sparse: bool = False
    check_values: Optional[bool] = None
    what: str = "features"


@dataclass(frozen=True)
class Clone:
    """An estimator cloned for each group.  ``seeds[g]`` becomes its ``random_state`` (bagging
    members always; a key's model where the estimator left it None).  ``member``: a bagging member
    (:class:`Member`: fitted on ``feature_subsets[g]``, labels as indices into ``classes``), else a
    :class:`KeyModel` fitted on the labels as they are.  ``gpus``: see
    :func:`sparkml_dist.gpus.place_model`."""

    blob: bytes
    seeds: Tuple[int, ...] = ()
    member: bool = False
    classes: Tuple[float, ...] = ()
    feature_subsets: Tuple[Tuple[int, ...], ...] = ()
    gpus: Optional[Tuple[str, ...]] = None

    def sparse_ok(self, estimator) -> bool:
        return feature_arrays.accepts_sparse(estimator)


@dataclass(frozen=True)
class Function:
    """The user's ``fn(data, key)`` (cloudpickled by this run's driver), returning a model or
    ``(model, {"metric": value})``; ``seeds[g]`` seeds ``random`` and ``numpy.random`` first."""

    blob: bytes
    seeds: Tuple[int, ...] = ()


Recipe = Union[Clone, Function]


@dataclass(frozen=True)
class GroupFitSpec:
    """What every fitting task gets: the recipe, the inputs, each group's key, the error policy
    (``"raise"`` | ``"skip"``), the ``membersDir`` store (or None) and what a group is called in
    messages (``"group"``, ``"key"``)."""

    recipe: Recipe
    inputs: Inputs
    keys: Tuple[Any, ...]
    on_error: str = "raise"
    store: Optional[Any] = None
    what: str = "group"


@dataclass
class GroupResult:
    """One group's outcome: its fitted result (a :class:`Member` or :class:`KeyModel`, None when
    written to the store or skipped), the rows it saw, its metrics, or why it was skipped."""

    group: int
    key: Any
    rows: int
    model: Any = None
    metrics: dict = field(default_factory=dict)
    error: Optional[str] = None
    stored: Optional[List[dict]] = None


def fresh_copy(estimator):
    """A fresh unfitted copy: scikit-learn's ``clone`` for an estimator with ``get_params`` (its
    errors reach the user), a deep copy for any other object with the scikit-learn API."""
    if hasattr(estimator, "get_params"):
        from sklearn.base import clone

        return clone(estimator)
    return copy.deepcopy(estimator)


# --------------------------------------------------------------------------- a group's rows
def _columns(parts: List[pa.RecordBatch], name: str) -> np.ndarray:
    return np.concatenate([b.column(name).to_numpy(zero_copy_only=False) for b in parts])


def _numeric(values: np.ndarray) -> bool:
    return values.dtype.kind in "biuf"


def group_data(parts: List[pa.RecordBatch], inputs: Inputs, sparse_ok: bool):
    """The group's rows in their fixed order as ``(X, y, w)``, or a pandas DataFrame without
    ``features``.  ``parts`` is emptied as the rows are read: a single vector column whose rows
    arrive in key order (Spark sorted them) is copied into its CSR matrix batch by batch, so the
    group is held about once while the matrix is built, not twice."""
    keys = _columns(parts, KEY_COL)
    y = _columns(parts, inputs.label) if inputs.label else None
    w = _columns(parts, inputs.weight).astype(np.float64) if inputs.weight else None
    if y is not None and _numeric(y):
        y = y.astype(np.float64)
    single = len(inputs.features) == 1
    vector = single and feature_arrays.is_vector(parts[0].schema.field(inputs.features[0]).type)
    if vector and (sparse_ok or inputs.keep_sparse) and np.all(keys[1:] >= keys[:-1]):
        what = inputs.what
        X = feature_arrays.csr_from_batches(parts, inputs.features[0], inputs.n_features, what)
        if not inputs.keep_sparse and X.shape[0]:
            if X.nnz >= feature_arrays.SPARSE_SHARE * X.shape[0] * X.shape[1]:
                X = X.toarray()  # mostly stored anyway: dense is faster (feature_arrays.matrix's rule)
        _check(X, inputs)
        return X, y, w
    tiebreak = [a for a in (y, w) if a is not None and _numeric(a)]
    order = pa.array(order_rows(keys, *tiebreak))
    table = pa.Table.from_batches(parts).take(order)
    parts.clear()
    y = y[order.to_numpy()] if y is not None else None
    w = w[order.to_numpy()] if w is not None else None
    if not inputs.features:
        return table.drop_columns([c for c in (GROUP_COL, KEY_COL) if c in table.column_names]).to_pandas()
    X = feature_arrays.stack(
        [table.column(c) for c in inputs.features],
        list(inputs.features),
        inputs.n_features,
        sparse_ok=sparse_ok or inputs.keep_sparse,
        keep_sparse=inputs.keep_sparse,
    )
    del table
    _check(X, inputs)
    return X, y, w


def _check(X, inputs: Inputs) -> None:
    if inputs.check_values is not None:
        feature_arrays.check_finite(X, inputs.check_values, inputs.what)


# --------------------------------------------------------------------------- recipes
def _fit_clone(recipe: Clone, estimator, group: int, key: Any, data) -> Any:
    X, y, w = data
    model = fresh_copy(estimator)
    seed = recipe.seeds[group] if recipe.seeds else None
    params = model.get_params(deep=False) if hasattr(model, "get_params") else {}
    if seed is not None and "random_state" in params and (recipe.member or params["random_state"] is None):
        model.set_params(random_state=seed)
    if not recipe.member:
        _fit(model, X, y, w)
        return KeyModel(group, key, model, len(y))
    feats = np.asarray(recipe.feature_subsets[group], dtype=np.int64)
    Xg = X[:, feats] if feats.size != X.shape[1] else X
    del X
    present = np.unique(y) if recipe.classes else None
    classes = np.searchsorted(np.asarray(recipe.classes), present) if recipe.classes else None
    if present is not None and present.size == 1:
        return Member(group, None, feats, classes, len(y), constant=True)
    yg = np.searchsorted(present, y) if present is not None else y  # local labels 0..c-1 (XGBoost)
    if recipe.gpus is not None:
        gpus_mod.place_model(model, recipe.gpus, group)
    _fit(model, Xg, yg, w)
    return Member(group, model, feats, classes, len(y))


def _fit(model, X, y, w) -> None:
    if w is not None:
        model.fit(X, y, sample_weight=w)
    else:
        model.fit(X, y)


def _call_function(fn, recipe: Function, group: int, key: Any, data) -> KeyModel:
    import random

    if recipe.seeds:
        random.seed(recipe.seeds[group])
        np.random.seed(recipe.seeds[group])
    rows = len(data) if not isinstance(data, tuple) else data[0].shape[0]
    out = fn(data if not isinstance(data, tuple) else data[:2], key)
    model, metrics = (
        out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else (out, {})
    )
    if model is None:
        raise ValueError(
            "fn returned no model: end it with `return model` or `return model, {metric: value}`"
        )
    return KeyModel(group, key, model, rows, {str(k): float(v) for k, v in metrics.items()})


def _store(store, result) -> List[dict]:
    """``result`` written as the one member record (what the driver would refuse to read back is
    refused here, in words for the function's author)."""
    try:
        return write_member(store.write, result)
    except Exception as exc:  # noqa: BLE001 - the formats' own refusal, reworded
        raise ValueError(
            f"the model is a {type(result.model).__name__}, which no safe model format can store "
            f"({exc}); return a scikit-learn-API model, an XGBoost/LightGBM model or plain data"
        ) from None


# --------------------------------------------------------------------------- the loop
def fit_groups(batches: Iterable[pa.RecordBatch], spec: GroupFitSpec) -> Iterator[pa.RecordBatch]:
    """Executor task: the rows of one or more groups in, one result per group out (see the
    module docstring); one group is held at a time."""
    recipe = spec.recipe
    loaded = serialization.loads(recipe.blob)  # the estimator or the function, once per task
    for group, parts in group_runs(b for b in batches if b.num_rows):
        yield _one(spec, loaded, group, parts)


def _one(spec: GroupFitSpec, loaded, group: int, parts: List[pa.RecordBatch]) -> pa.RecordBatch:
    recipe, key = spec.recipe, spec.keys[group]
    rows = sum(b.num_rows for b in parts)
    try:
        if isinstance(recipe, Function):
            result = _call_function(loaded, recipe, group, key, group_data(parts, spec.inputs, True))
        else:
            data = group_data(parts, spec.inputs, recipe.sparse_ok(loaded))
            result = _fit_clone(recipe, loaded, group, key, data)
        out = GroupResult(group, key, rows, metrics=getattr(result, "metrics", {}))
        if spec.store is None:
            out.model = result
        else:  # only the files' metadata goes back to the driver
            out.stored = _store(spec.store, result)
        return collection.encode(group, 0, out)
    except Exception as exc:  # noqa: BLE001 - the fit's own error, reported with its group and traceback
        why = f"{spec.what} {key!r} ({rows} rows): {type(exc).__name__}: {exc}"
        if spec.on_error == "raise":
            return collection.encode_error(group, f"fitting {why}")
        return collection.encode(
            group, 0, GroupResult(group, key, rows, error=f"{why}\n{traceback.format_exc()}")
        )
