"""Each group's rows -> its fitted model: the recipe of every per-group trainer.  [executor]

:func:`fit_one` fits one group for the task loop (:func:`.task.fit_groups`):

1. its rows are put in one fixed order, by their row key (``KEY_COL``, a hash of the seed and the
   row; ties, i.e. bootstrap copies of one row, by label and weight), so a group is fitted on the
   same rows in the same order on every retry, input partitioning and cluster shape (rows Spark
   already sorted so are taken as they come);
2. they become what the recipe fits on (:class:`Inputs`): ``(X, y, w)`` with ``X`` the feature
   columns side by side (:func:`sparkml_dist.feature_arrays.stack`: Spark ML vectors stay sparse
   where the model takes it, or always for the user's function), or a pandas DataFrame of the
   group's columns;
3. the recipe fits: :class:`Clone` (a copy of the task's :class:`Template` with the group's seed:
   a bagging member on its feature subset, or a key's model) or :class:`Function` (the user's
   ``fn(data, key)``, with ``random`` and ``numpy.random`` seeded with the group's seed);
4. one error policy (``on_error``: the group's error and traceback fail the fit, or it is listed as
   skipped) and one output: the result collected, written to the ``membersDir`` store as the one
   member record (:mod:`.member_records`) with only its metadata sent back, or (a fit of many
   keys) encoded for the task's block (:mod:`sparkml_dist.ensemble.stored.key_blocks`).

Nothing here touches a SparkSession.
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa

from ... import collection, feature_arrays, serialization
from ... import formats as model_formats
from ... import gpus as gpus_mod
from ...group_rows import GROUP_COL, KEY_COL, order_rows
from ..member_records import KeyModel, Member, write_member
from .stream import Counted, fit_stream, user_batches


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
    """What every fitting task gets: the recipe, the inputs, each group's key (None: each group's
    rows carry it, ``KEY_VALUE_COL``), the error policy (``"raise"`` | ``"skip"``), the
    ``membersDir`` store (or None), what a group is called in messages (``"group"``, ``"key"``) and,
    for a fit of many keys, ``blocks``: ``(fit id, number of keys, the model's state for its
    members table)``: the models go out in blocks
    (:mod:`sparkml_dist.ensemble.stored.key_blocks`), each written to the store or collected whole."""

    recipe: Recipe
    inputs: Inputs
    keys: Optional[Tuple[Any, ...]]
    on_error: str = "raise"
    store: Optional[Any] = None
    what: str = "group"
    blocks: Optional[Tuple[str, int, dict]] = None
    progress: Optional[tuple] = None  # (host, port, secret): the driver's bar of groups done
    key_timeout: Optional[float] = None  # seconds a group's fit may take (see engine.key_watch)
    stream: Any = None  # None | "all" | {group: its classes or None}: the groups trained from a stream


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
    encoded: Optional[Tuple[str, bytes]] = None  # blocks: the model in its safe format


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
    table = pa.Table.from_batches(parts)
    parts.clear()
    if keys.size > 1 and not np.all(keys[1:] > keys[:-1]):  # else Spark sorted them already, no ties
        tiebreak = [a for a in (y, w) if a is not None and _numeric(a)]
        order = order_rows(keys, *tiebreak)
        table = table.take(pa.array(order))
        y = y[order] if y is not None else None
        w = w[order] if w is not None else None
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
class Template:
    """A task's estimator, copied for each group: scikit-learn's ``clone`` (and the signature
    inspection it does) runs once per task, then each group gets a deep copy of that fresh clone,
    which is the same object (``clone`` deep-copies every parameter), in about 1/20 of the time;
    whether it takes the group's seed (``random_state``) is read once too.  scikit-learn checks an
    estimator's parameters at each ``fit`` (about a tenth of a small group's fit): the copies all
    hold the same ones, so once the task's first fit has passed that check, the later fits skip it
    (its data checks, NaN included, still run on every group)."""

    def __init__(self, estimator: Any, member: bool) -> None:
        self.estimator = fresh_copy(estimator)
        params = estimator.get_params(deep=False) if hasattr(estimator, "get_params") else {}
        self.seeded = "random_state" in params and (member or params["random_state"] is None)
        base = getattr(__import__("sys").modules.get("sklearn.base"), "BaseEstimator", None)
        self.plain = base is not None and isinstance(estimator, base)
        self.checked = False  # a fit of a copy passed scikit-learn's parameter check

    def fit(self, model: Any, X, y, w) -> None:
        """``model`` (a copy from :meth:`new`) fitted; its parameters checked on the first fit only."""
        if not (self.plain and self.checked):
            _fit(model, X, y, w)
            self.checked = self.plain
            return
        import sklearn

        with sklearn.config_context(skip_parameter_validation=True):
            _fit(model, X, y, w)

    def new(self, seed: Optional[int]) -> Any:
        model = copy.deepcopy(self.estimator)
        if seed is not None and self.seeded:
            if self.plain:  # what scikit-learn's set_params does for a top-level parameter
                model.random_state = seed
            else:
                model.set_params(random_state=seed)
        return model


def _fit_clone(recipe: Clone, template: Template, group: int, key: Any, data) -> Any:
    X, y, w = data
    model = template.new(recipe.seeds[group] if recipe.seeds else None)
    if not recipe.member:
        template.fit(model, X, y, w)
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
    template.fit(model, Xg, yg, w)
    return Member(group, model, feats, classes, len(y))


def _fit(model, X, y, w) -> None:
    if w is not None:
        model.fit(X, y, sample_weight=w)
    else:
        model.fit(X, y)


def _call_function(fn, recipe: Function, group: int, key: Any, data, rows: int) -> KeyModel:
    import random

    if recipe.seeds:
        random.seed(recipe.seeds[group])
        np.random.seed(recipe.seeds[group])
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

    def write(group: int, item: int, obj: Any) -> dict:
        fmt, data = _encoded(obj)
        return store.write_bytes(group, item, data, fmt=fmt)

    return write_member(write, result)


# --------------------------------------------------------------------------- one group
def fit_one(spec: GroupFitSpec, loaded, group: int, key: Any, parts):
    """One group fitted, its rows held (a list of batches) or streamed (a :class:`~.stream.Counted`
    iterator: :mod:`.stream`): its result as a collected batch, or (blocks) a
    :class:`GroupResult` with the model encoded; a failure as an error batch
    (``on_error="raise"``) or in the result."""
    recipe = spec.recipe
    streamed = isinstance(parts, Counted)
    rows = parts.rows if streamed else sum(b.num_rows for b in parts)
    try:
        if isinstance(recipe, Function):
            data = user_batches(parts) if streamed else group_data(parts, spec.inputs, True)
            result = _call_function(loaded, recipe, group, key, data, rows)
        elif streamed:
            model = loaded.new(recipe.seeds[group] if recipe.seeds else None)
            sparse_ok = recipe.sparse_ok(loaded.estimator)
            convert = lambda chunk: group_data(chunk, spec.inputs, sparse_ok)  # noqa: E731
            result = fit_stream(model, group, key, parts, convert, spec.stream.get(group))
        else:
            data = group_data(parts, spec.inputs, recipe.sparse_ok(loaded.estimator))
            result = _fit_clone(recipe, loaded, group, key, data)
        rows = parts.drain() if streamed else rows
        out = GroupResult(group, key, rows, metrics=getattr(result, "metrics", {}))
        if spec.blocks is not None:  # collected: as the collection layer carries any result
            out.encoded = ("pickle", serialization.dumps(result.model)) if spec.store is None else None
            out.encoded = out.encoded or _encoded(result.model)
            return out
        if spec.store is None:
            out.model = result
        else:  # only the files' metadata goes back to the driver
            out.stored = _store(spec.store, result)
        return collection.encode(group, 0, out)
    except Exception as exc:  # noqa: BLE001 - the fit's own error, reported with its group and traceback
        rows = parts.drain() if streamed else rows
        why = f"{spec.what} {key!r} ({rows} rows): {type(exc).__name__}: {exc}"
        if spec.on_error == "raise":
            return collection.encode_error(group, f"fitting {why}")
        out = GroupResult(group, key, rows, error=f"{why}\n{traceback.format_exc()}")
        return out if spec.blocks is not None else collection.encode(group, 0, out)


def _encoded(model: Any) -> Tuple[str, bytes]:
    """The model in its safe format (what no safe format holds is refused in words for the
    function's author)."""
    try:
        return model_formats.encode(model)
    except Exception as exc:  # noqa: BLE001 - the formats' own refusal, reworded
        raise ValueError(
            f"the model is a {type(model).__name__}, which no safe model format can store "
            f"({exc}); return a scikit-learn-API model, an XGBoost/LightGBM model or plain data"
        ) from None
