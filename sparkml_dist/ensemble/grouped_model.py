"""The fitted models of a :class:`~.GroupedTrainer`, one per key.  [driver]

A :class:`GroupedModel` holds references, not models (:class:`~.stored.key_models.KeyModels`): the keys,
the rows each key's model saw, and the blocks that hold the models (``membersDir``'s files, a
saved model's, or the blocks' bytes collected when neither is set).  ``model.models[key]`` reads
that key's block and decodes that key's model; ``transform`` joins each row to its key's index
(a broadcast join) and each task reads the blocks its rows' keys are in, once per Python worker,
decoding the models its rows use.  Past :data:`ROUTE_KEYS` keys the rows of a run of blocks go to
one task (a shuffle), so that no task reads every block and each key's model predicts its rows
in one call, not once per task; the rows then come grouped by block, not in their input order.
Saving copies the blocks as they are (nothing is decoded) beside the keys.

Example::

    model = GroupedTrainer(estimator=Ridge(), groupCol="store", featuresCols=["x"]).fit(df)
    model.models["north"].coef_, len(model.keys), model.failedGroups
    model.transform(new_df).select("store", "prediction")
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pyarrow as pa
from pyspark.ml import Model

from .. import plan, serialization, spark_compat
from ..errors import ConfigurationError
from ..group_rows import GROUP_COL
from . import validation
from .member_records import FEATURES, KeyModel
from .params import GroupedParams
from .scoring.keys import BLOCK_COL, INDEX_COL, PredictSpec, predict_keys, predict_rows
from .stored import key_models
from .stored.key_models import KeyModels
from .stored.members_table import TableMembers, read_table
from .stored.persistence import StageReadWrite

ROUTE_KEYS = 4096  # more keys: each row is scored in the task that reads its key's block


class ModelsByKey(Mapping):
    """``{key: fitted model}`` over a :class:`KeyModels`, each model decoded when it is read."""

    def __init__(self, models: KeyModels) -> None:
        self._models, self._ok = models, np.flatnonzero(models.ok)

    def __getitem__(self, key: Any) -> Any:
        i = self._models.position(key)
        if i in self._models.failed:
            raise KeyError(key)
        return self._models.model(i)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._models.python_keys(self._ok))

    def __len__(self) -> int:
        return len(self._ok)

    def items(self):  # one block read at a time, in key order
        keys = self._models.python_keys(self._ok)
        return ((k, self._models.model(int(i))) for k, i in zip(keys, self._ok))


class GroupedModel(Model, GroupedParams, StageReadWrite, TableMembers):
    """The models of a :class:`GroupedTrainer`, one per key (see the module docstring).
    ``members``: models given whole (:class:`KeyModel`\\ s), instead of ``models``."""

    def __init__(
        self,
        models: Optional[KeyModels] = None,
        skipped: Optional[Dict[Any, int]] = None,
        label_is_string: bool = False,
        members: Optional[List[KeyModel]] = None,
    ):
        super().__init__()
        if models is None:
            members = sorted(members or [], key=lambda m: m.group)
            entries = [(m.model, m.rows, m.metrics) for m in members]
            models = KeyModels.from_models(pa.array([m.key for m in members]), entries)
        self._models = models
        self._skipped = dict(skipped or {})
        self._label_is_string = bool(label_is_string)
        self.failedGroups: Dict[Any, str] = {}  # a fit with onError="skip": {key: why its fit failed}

    @property
    def keys(self) -> List[Any]:
        """The keys that have a model, in sorted order."""
        return self._models.python_keys(np.flatnonzero(self._models.ok))

    @property
    def models(self) -> Mapping:
        """``{key: fitted model}``, each read when asked for (see the module docstring)."""
        return ModelsByKey(self._models)

    @property
    def groupSizes(self) -> Dict[Any, int]:
        ok = np.flatnonzero(self._models.ok)
        return dict(zip(self._models.python_keys(ok), self._models.rows[ok].tolist()))

    @property
    def skippedGroups(self) -> Dict[Any, int]:
        """Keys left without a model (fewer than minRows rows) and their row counts."""
        return dict(self._skipped)

    def predict(self, X, keys) -> np.ndarray:
        """Local predictions: row i from the model of ``keys[i]`` (``unseenKey`` applies)."""
        X = X.tocsr() if hasattr(X, "tocsr") else np.asarray(X, dtype=np.float64)
        out_type = pa.string() if self._label_is_string else pa.float64()
        key_array = pa.array(list(keys))
        idx = self._models.indices(key_array)
        preds = predict_rows(key_array, idx, X, self._models.model, self.getUnseenKey(), out_type)
        return np.asarray(preds.to_pylist(), dtype=object if self._label_is_string else np.float64)

    def _transform(self, dataset):
        from pyspark.sql import types as T

        self._check_params(dataset)
        feats = validation.features_column(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        if self.getPredictionCol() in dataset.columns:
            raise ConfigurationError(
                f"predictionCol={self.getPredictionCol()!r} is already a column; set another predictionCol"
            )
        indexed = self._indexed(dataset.withColumn(FEATURES, feats))
        blob = serialization.dumps(self._models.without_keys())
        spec = PredictSpec(
            self.getGroupCol(),
            self.getPredictionCol(),
            "string" if self._label_is_string else "double",
            serialization.digest(blob),
            blob,
            self.getUnseenKey(),
        )
        out_type = T.StringType() if self._label_is_string else T.DoubleType()
        schema = T.StructType(
            dataset.schema.fields + [T.StructField(self.getPredictionCol(), out_type, True)]
        )
        return indexed.mapInArrow(partial(predict_keys, spec=spec), schema)

    def _indexed(self, df):
        """``df`` with each row's key index and block (a broadcast join with the keys); past
        :data:`ROUTE_KEYS` keys, the rows of a run of blocks in one partition (a shuffle: the rows
        then come grouped by block, not in their input order)."""
        from pyspark.sql import functions as F

        from .engine.key_counts import key_table

        key_col = self.getGroupCol()
        key_type = df.schema[key_col].dataType
        keys = _keys_as(self._models.keys, key_type, key_col)
        blocks = np.searchsorted(self._models._starts, np.arange(len(keys)), side="right") - 1
        table = key_table(df.sparkSession, keys, key_col, key_type, {BLOCK_COL: pa.array(blocks, pa.int32())})
        joined = df.join(F.broadcast(table.withColumnRenamed(GROUP_COL, INDEX_COL)), on=key_col, how="left")
        joined = joined.select(*df.columns, INDEX_COL, BLOCK_COL)
        n_blocks = len(self._models.blocks)
        if len(keys) <= ROUTE_KEYS:  # every task reads the few it needs: the rows keep their order
            return joined
        parts = min(n_blocks, plan.plan_concurrency(df.sparkSession, 0).concurrency * 4)
        run = F.coalesce(F.col(BLOCK_COL) * parts / n_blocks, F.lit(0)).cast("int")  # no key: anywhere
        return spark_compat.repartition_by_id(joined.withColumn("__sd_part", run), parts, "__sd_part").drop(
            "__sd_part"
        )

    # persistence (StageReadWrite stores the blocks and the keys; this state in metadata)
    def _saved_members(self, store, write) -> List[dict]:
        return self._models.save(store)

    def _persisted_state(self) -> dict:
        return {
            "label_is_string": self._label_is_string,
            "skipped": [[k, n] for k, n in self._skipped.items()],
        }

    def _restore_state(self, state: dict, members) -> None:
        self._models = members if isinstance(members, KeyModels) else GroupedModel(members=members)._models
        self.failedGroups = {self._models.key(i): why for i, why in self._models.failed.items()}
        self._label_is_string = bool(state.get("label_is_string", False))
        self._skipped = {k: n for k, n in state.get("skipped", [])}

    def members_table(self, spark=None, *, key: Any = None):
        """The models as a members table (:mod:`.stored.members_table`, one row per key; a key whose
        fit failed keeps its row, format ``failed``, with its reason in the record)."""
        from pyspark.sql import SparkSession

        spark = spark or SparkSession.getActiveSession()
        if spark is None:
            raise ConfigurationError("members_table(spark): no active SparkSession; pass one")
        return key_models.members_table(self._models, spark, key)

    def _table_state(self) -> dict:
        return {"label_is_string": self._label_is_string}

    @classmethod
    def from_table(
        cls, df, *, key: Any = None, trusted_types=(), allow_pickle: bool = False, **params
    ) -> "GroupedModel":
        """The model whose :meth:`members_table` ``df`` holds (every row checked as the model
        store's files are, then decoded; a key whose fit failed comes back in ``failedGroups``);
        ``params`` set its Params (``groupCol=``, ``featuresCols=`` ...)."""
        rows = sorted(read_table(df, key, trusted_types, allow_pickle), key=lambda r: r[4].get("group", 0))
        if not rows:
            raise ConfigurationError("the members table has no rows: there is no model to rebuild")
        keys = pa.array([record.get("key", group) for group, _, _, _, record in rows])
        entries = [(m, n, metrics, record.get("error")) for _, n, m, metrics, record in rows]
        fold = (rows[0][4].get("model") or {}).get("key_fold")
        model = cls(KeyModels.from_models(keys, entries, fold))
        model._label_is_string = bool((rows[0][4].get("model") or {}).get("label_is_string"))
        model.failedGroups = {model._models.key(i): why for i, why in model._models.failed.items()}
        model._set(**params)
        return model


def _keys_as(keys: pa.Array, key_type, key_col: str) -> pa.Array:
    """The model's keys in the Arrow type of the scored column (a type that cannot hold them is
    refused, naming the column)."""
    from pyspark.sql.pandas.types import to_arrow_type

    want = to_arrow_type(key_type)
    if keys.type == want:
        return keys
    try:
        return keys.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConfigurationError(
            f"groupCol={key_col!r} is {key_type.simpleString()} here, but the model's keys are "
            f"{keys.type} and do not convert ({exc}); cast the column to the type it was trained with"
        ) from None
