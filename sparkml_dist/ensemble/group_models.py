"""What ``train_per_group`` returns: each group's model, held as a reference; the models as a table.  [driver]

A :class:`GroupModels` holds its groups' models as references to blocks
(:class:`~.stored.key_models.KeyModels`): ``result[key]`` (a :class:`GroupMember`) reads and decodes
that group's model when asked, ``members`` iterates them, ``skipped`` names the groups whose ``fn``
failed; ``to_table()`` / ``from_table()`` turn them into a members table and back
(:mod:`.stored.members_table`).

Example::

    result = train_per_group(df, fit, group_col="store")
    result["north"].model, result["north"].metrics, result.skipped
    GroupModels.from_table(result.to_table(spark))
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from typing import Any, Dict, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..errors import ConfigurationError
from .stored import key_models, members_table
from .stored.key_models import KeyModels


class GroupMember:
    """One group's model: its key (``group``), the ``rows`` it was trained on, the ``model`` and its
    ``metrics``.  The model stays in its block (``membersDir``'s file, or the bytes collected) until
    ``.model`` or ``.metrics`` is first read (checked, decoded through the safe formats)."""

    def __init__(self, group: Any, rows: int, model: Any = None, metrics=None, source=None) -> None:
        self.group, self.rows = group, rows
        self._model, self._metrics, self._source = model, metrics, source  # source: (KeyModels, index)

    @property
    def model(self) -> Any:
        if self._model is None and self._source is not None:
            self._model = self._source[0].model(self._source[1])
        return self._model

    @property
    def metrics(self) -> dict:
        if self._metrics is None:
            self._metrics = dict(self._source[0].entry(self._source[1])[2]) if self._source else {}
        return self._metrics

    def __repr__(self) -> str:
        where = (
            f"in {self._source[0].uri or 'a collected block'}"
            if self._model is None and self._source
            else type(self._model).__name__
        )
        return f"GroupMember(group={self.group!r}, rows={self.rows}, model={where})"


class _Members(SequenceABC):
    """The members of a :class:`GroupModels`, in key order, each made when it is read."""

    def __init__(self, models: KeyModels) -> None:
        self._models, self._ok = models, np.flatnonzero(models.ok)

    def __len__(self) -> int:
        return len(self._ok)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        k = int(self._ok[i])
        return GroupMember(self._models.key(k), int(self._models.rows[k]), source=(self._models, k))

    def __iter__(self) -> Iterator[GroupMember]:
        keys = self._models.python_keys(self._ok)
        for key, k in zip(keys, self._ok):
            yield GroupMember(key, int(self._models.rows[k]), source=(self._models, int(k)))


class GroupModels:
    """What :func:`train_per_group` returns: ``members`` (in key order, each model read when
    used), ``skipped`` ({key: error}) and ``result[key]``: that key's member."""

    def __init__(self, models: KeyModels, skipped: Optional[Dict[Any, str]] = None, spark=None) -> None:
        self._models, self.skipped, self._spark = models, dict(skipped or {}), spark

    @property
    def members(self) -> Sequence[GroupMember]:
        return _Members(self._models)

    def __getitem__(self, key) -> GroupMember:
        i = self._models.position(key)
        if i in self._models.failed:
            raise KeyError(key)
        return GroupMember(self._models.key(i), int(self._models.rows[i]), source=(self._models, i))

    def to_table(self, spark=None, *, key: Any = None):
        """A Spark DataFrame of the members, one row each (:mod:`.stored.members_table`: ``group, rows,
        format, model, metrics, record, sha256``; a group whose fit failed keeps its row, format
        ``failed``), each model in a safe format (never a pickle) with a SHA-256 (an HMAC with
        ``key=`` or ``SPARKML_DIST_MODEL_KEY``), for ``df.write.parquet`` and SQL over the
        members.  ``spark``: the session (default: the one the members were trained with, else
        the active one)."""
        return key_models.members_table(self._models, spark or self._spark or _active_session(), key)

    @classmethod
    def from_table(
        cls, df, *, key: Any = None, trusted_types: Sequence[str] = (), allow_pickle: bool = False
    ) -> "GroupModels":
        """Members back from a table :meth:`to_table` wrote: every row's bytes checked against its
        digest and decoded through the same safe formats and validation as the model store (a
        forged row is refused like a forged file).  Keys come back as they were written (text
        where JSON could not hold them), in their order."""
        rows = sorted(members_table.read_table(df, key, trusted_types, allow_pickle), key=_order)
        keys = [record.get("key", g) for g, _, _, _, record in rows]
        entries = [(m, n, metrics, record.get("error")) for _, n, m, metrics, record in rows]
        skipped = {k: e[3] for k, e in zip(keys, entries) if e[3] is not None}
        fold = (rows[0][4].get("model") or {}).get("key_fold") if rows else None
        return cls(KeyModels.from_models(pa.array(keys), entries, fold), skipped)


def _order(row) -> tuple:
    """A table's rows in their fit's order (the key's index), else by group."""
    return (row[4].get("group", 0), str(row[0]))


def _active_session():
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigurationError("to_table(): no active SparkSession; pass one: to_table(spark)")
    return spark
