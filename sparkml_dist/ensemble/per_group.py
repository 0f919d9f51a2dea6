"""Your own training function per group of rows: ``train_per_group``; the models as a table.  [driver]

The plainest distributed pattern (``mapPartitions`` with your own code): ``fn(data, key)`` runs
inside the executors once per group, on all of that group's rows, and returns a fitted model, or
``(model, {"metric": value, ...})``::

    from sparkml_dist.ensemble import train_per_group

    def fit(data, key):                           # data: a pandas DataFrame of the group's rows
        model = LogisticRegression().fit(data[["x1", "x2"]], data["label"])
        return model, {"train_acc": model.score(data[["x1", "x2"]], data["label"])}

    result = train_per_group(df, fit, groupCol="store")            # one model per store
    result = train_per_group(df, fit, numGroups=8, sampling="bootstrap", sampleRatio=0.5, seed=7)
    result.members[0].model, result.members[0].metrics, result.skipped
    result.to_table(spark).write.parquet("models/")    # (group, rows, format, model, metrics, ...)

Groups come from a column's values (``groupCol``: one group per distinct non-null key) or from the
shared partitioning layer (``numGroups`` + ``sampling`` / ``sampleRatio`` / ``seed``: the same
groups :class:`BaggingClassifier` deals for the same ``featuresCols``, ``labelCol``, seed and
rows).  With ``featuresCols``, ``fn`` gets ``(X, y)`` instead of a DataFrame: ``X`` the feature
columns stacked (sparse vector columns stay sparse: ``X`` is then a ``scipy.sparse.csr_matrix``),
``y`` the ``labelCol`` values.  A group's rows come in a fixed order (by a hash of the seed and the
row), so a retried task or another cluster shape calls ``fn`` with the same data.

``membersDir`` (storage the executors and the driver share): each task writes its group's model
there in a safe format and sends back only the file's name and SHA-256, so the driver never holds
the models (``member.model`` reads one when asked).  ``resources={"cpus": c, "gpus": g}``: what
each task asks of a cluster master (a stage-level profile; ``fn`` finds its GPUs with
``TaskContext.get().resources()["gpu"].addresses``); local masters schedule no task resources.

A group whose ``fn`` raises fails the call with a ``WorkerError`` naming the key and carrying the
traceback (``onError="raise"``), or is listed in ``skipped`` with its error (``onError="skip"``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import arg_checks, launch, partitioning, plan
from ..errors import CollectionError, ConfigurationError
from ..group_rows import GROUP_COL, KEY_COL
from ..tune.resources import task_profile
from . import member_store, members_table
from ._per_group_worker import PerGroupSpec, fit_per_group
from .member_records import FEATURES, LABEL

log = logging.getLogger(__name__)


class GroupMember:
    """One group's model: its key (``group``), the ``rows`` it was trained on, the ``model`` and its
    ``metrics``.  With ``membersDir`` the model stays in storage until ``.model`` is first read
    (checked against the SHA-256 its task reported, decoded through the safe formats)."""

    def __init__(self, group: Any, rows: int, model: Any = None, metrics=None, stored=None) -> None:
        self.group, self.rows, self.metrics = group, rows, dict(metrics or {})
        self._model, self._stored = model, stored  # stored: (store uri, the file's metadata)

    @property
    def model(self) -> Any:
        if self._model is None and self._stored is not None:
            from ..model_store import ModelStore

            uri, meta = self._stored
            self._model = ModelStore(uri).decode(meta)
        return self._model

    def __repr__(self) -> str:
        where = (
            f"stored in {self._stored[0]}"
            if self._model is None and self._stored
            else type(self._model).__name__
        )
        return f"GroupMember(group={self.group!r}, rows={self.rows}, model={where}, metrics={self.metrics})"


@dataclass
class GroupModels:
    """What :func:`train_per_group` returns: ``members`` (in key order) and ``skipped``
    ({key: error})."""

    members: List[GroupMember]
    skipped: Dict[Any, str] = field(default_factory=dict)

    def __getitem__(self, key) -> GroupMember:
        for m in self.members:
            if m.group == key:
                return m
        raise KeyError(key)

    def to_table(self, spark, *, key: Any = None):
        """A Spark DataFrame of the members, one row each (:mod:`.members_table`: ``group, rows,
        format, model, metrics, record, sha256``), each model in a safe format (skops, XGBoost's
        own, JSON; never a pickle) with a SHA-256 (an HMAC with ``key=`` or
        ``SPARKML_DIST_MODEL_KEY``), for ``df.write.parquet`` and SQL over the members."""
        entries = [(m.group, m.rows, m.model, m.metrics, {}) for m in self.members]
        return members_table.to_table(spark, entries, key)

    @classmethod
    def from_table(
        cls, df, *, key: Any = None, trusted_types: Sequence[str] = (), allow_pickle: bool = False
    ) -> "GroupModels":
        """Members back from a table :meth:`to_table` wrote: every row's bytes checked against its
        digest and decoded through the same safe formats and validation as the model store (a
        forged row is refused like a forged file).  Keys come back as strings, in their order."""
        rows = members_table.read_table(df, key, trusted_types, allow_pickle)
        return cls([GroupMember(g, n, model, metrics) for g, n, model, metrics, _ in rows])


def _payload(fn: Callable) -> bytes:
    from .. import serialization
    from ..runner.admission import unpicklable_part

    if not callable(fn):
        raise ConfigurationError(f"fn must be a function fn(data, key), got {type(fn).__name__}")
    try:
        return serialization.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - whatever the captured object raises
        raise ConfigurationError(
            f"cannot send fn to the executors: {type(exc).__name__}: {exc}.{unpicklable_part(fn)}"
        ) from None


def _check_columns(df, features: Sequence[str], label: Optional[str]) -> None:
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    for c in list(features) + ([label] if label else []):
        if c not in fields:
            raise ConfigurationError(f"column {c!r} is not in the DataFrame; it has {sorted(fields)}")
    for c in features:
        t = fields[c]
        ok = isinstance(t, T.NumericType) or t.simpleString() == "vector"
        ok = ok or (isinstance(t, T.ArrayType) and isinstance(t.elementType, T.NumericType))
        if not ok:
            raise ConfigurationError(
                f"featuresCols: column {c!r} is {t.simpleString()}; expected numbers, arrays of numbers "
                "or vectors. Encode it first, or leave featuresCols unset to get a pandas DataFrame"
            )


def _by_key(df, key_col: str, seed: int, columns: List[str]):
    """(grouped rows, keys): one group per distinct non-null value of ``key_col``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    spark = launch.session_of(df)
    with launch.job_scope(spark, "sparkml_dist: counting groups"):
        counts = {r[0]: r[1] for r in df.groupBy(key_col).count().collect()}
    if None in counts:
        raise ConfigurationError(
            f"groupCol={key_col!r} is null in {counts[None]} rows: fill them or filter them out "
            f"(df.na.drop(subset=[{key_col!r}]))"
        )
    if not counts:
        raise ConfigurationError("the input DataFrame is empty; there is nothing to train")
    keys = tuple(sorted(counts))
    table = spark.createDataFrame(
        [(k, i) for i, k in enumerate(keys)],
        T.StructType(
            [T.StructField(key_col, df.schema[key_col].dataType), T.StructField(GROUP_COL, T.IntegerType())]
        ),
    )
    hashable = [c for c in df.columns if not partitioning.unkeyable_part(df.schema[c].dataType, hashing=True)]
    keyed = df.withColumn(KEY_COL, F.xxhash64(F.lit(int(seed)), *[F.col(c) for c in hashable]))
    width = max(1, len(df.columns))
    concurrency = plan.plan_concurrency(spark, max(counts.values()) * width * 8 * 3)
    parts = min(len(keys), concurrency.concurrency * 4)
    grouped = partitioning.assign_keys(keyed, key_col, table, parts)
    return grouped.select(GROUP_COL, KEY_COL, *columns), keys


def _by_split(df, spec, features: Sequence[str], label: Optional[str], columns: List[str]):
    """(grouped rows, group numbers) from the shared partitioning layer, keyed as bagging keys rows
    when the features are numeric columns (the same groups), else by every hashable column."""
    from pyspark.sql import types as T

    from .validation import features_column, numeric_column

    numeric = features and all(isinstance(df.schema[c].dataType, T.NumericType) for c in features)
    if numeric and label:
        keyed = df.withColumns(
            {FEATURES: features_column(df, "", list(features)), LABEL: numeric_column(df, label, "labelCol")}
        )
        key_cols = [FEATURES, LABEL]
    else:
        keyed = df
        key_cols = [
            c for c in df.columns if not partitioning.unkeyable_part(df.schema[c].dataType, hashing=True)
        ]
    if spec.sampling == "disjoint":
        with launch.job_scope(launch.session_of(df), "sparkml_dist: dealing rows to groups"):
            grouped, _ = partitioning.balanced_groups(keyed, spec, key_cols)
    else:
        grouped = partitioning.assign_groups(keyed, spec, key_cols)
    return grouped.select(GROUP_COL, KEY_COL, *columns), tuple(range(spec.num_groups))


def train_per_group(
    df,
    fn: Callable,
    *,
    groupCol: Optional[str] = None,
    numGroups: Optional[int] = None,
    sampling: str = "disjoint",
    sampleRatio: float = 1.0,
    featuresCols: Optional[Sequence[str]] = None,
    labelCol: Optional[str] = "label",
    seed: int = 0,
    onError: str = "raise",
    membersDir: Optional[str] = None,
    resources: Optional[Dict[str, int]] = None,
) -> GroupModels:
    """``fn(data, key)`` on every group of ``df``'s rows inside the executors; see the module
    docstring.  Returns a :class:`GroupModels`."""
    if (groupCol is None) == (numGroups is None):
        raise ConfigurationError("train_per_group: give groupCol (a column's values) or numGroups, not both")
    arg_checks.one_of("onError", onError, ("raise", "skip"))
    blob = _payload(fn)
    profile = task_profile(launch.session_of(df), resources, "resources")
    store = member_store.new_store(membersDir, "per_group")
    features = list(featuresCols or [])
    label = labelCol if features and labelCol else None
    _check_columns(df, features, label)
    if groupCol is not None and groupCol not in df.columns:
        raise ConfigurationError(f"groupCol={groupCol!r} is not in the DataFrame; it has {df.columns}")
    columns = features + ([label] if label else []) if features else list(df.columns)
    if groupCol is not None:
        grouped, keys = _by_key(df, groupCol, seed, columns)
    else:
        arg_checks.integer("numGroups", numGroups, 1)
        spec = partitioning.SplitSpec(
            num_groups=numGroups,
            sampling=sampling,
            sample_ratio=sampleRatio,
            seed=seed,
            names={"num_groups": "numGroups", "sampling": "sampling", "sample_ratio": "sampleRatio"},
        )
        grouped, keys = _by_split(df, spec, features, label, columns)
    results = launch.run_on_groups(
        grouped,
        fit_per_group,
        PerGroupSpec(blob, keys, tuple(features), label, onError, store),
        expected_groups=range(len(keys)),
        description=f"sparkml_dist: training {len(keys)} groups",
        what="group",
        profile=profile,
    )
    return _collected([results[(g, 0)] for g in range(len(keys))], store)


def _collected(out: list, store) -> GroupModels:
    """The :class:`GroupModels` of the tasks' results (with ``membersDir``: the store committed)."""
    skipped = {r.key: r.error for r in out if r.error is not None}
    if skipped:
        log.warning(
            "train_per_group: %d of %d groups skipped: %s", len(skipped), len(out), sorted(map(str, skipped))
        )
    if store is not None:
        committed = member_store.commit_checked(store, [r.stored for r in out if r.error is None])
        stored = {int(m["group"]): (store.uri, m) for m in committed}
        members = [
            GroupMember(r.key, r.rows, None, r.metrics, stored[r.group]) for r in out if r.error is None
        ]
    else:
        members = [GroupMember(r.key, r.rows, r.model, r.metrics) for r in out if r.error is None]
    if not members:
        raise CollectionError(
            f"train_per_group: every group failed; the first: {next(iter(skipped.values()))}"
        )
    return GroupModels(members, skipped)
