"""Members written by the executors to a model store, and read back one at a time.  [anywhere]

With ``membersDir`` set, a fitting task writes its member to a
:class:`~sparkml_dist.formats.store.ModelStore` there (a JSON record and the model in a format whose
loading runs no code, each file's SHA-256 sent back) and returns only that metadata, so the driver
never receives, holds or decodes the models: past ``spark.driver.maxResultSize`` a big ensemble
still fits.  The driver commits the store's manifest and the model keeps a :class:`LazyMembers`:

* iterating it loads one member at a time (``predict`` locally, saving the model: the driver never
  holds more than one member while it saves);
* shipped to executors for ``transform`` it is a few kilobytes: each Python worker reads the
  members from the store itself, once, verified against the SHA-256 sums the driver holds.

The layout is the saved model's: per group, item 0 the record and item 1 the model.
"""

from __future__ import annotations

import posixpath
import uuid
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from ...errors import ConfigurationError
from ...formats.store import ModelStore
from ..member_records import MODEL, RECORD, from_record


def new_store(members_dir: str, uid: str) -> "ModelStore | None":
    """A fresh store under ``members_dir`` for one fit (None when ``members_dir`` is not set)."""
    if not members_dir:
        return None
    return ModelStore(posixpath.join(members_dir.rstrip("/"), f"{uid}-{uuid.uuid4().hex[:12]}"))


def commit_checked(store: ModelStore, metas: List[dict]) -> List[dict]:
    """Commit the files the tasks wrote; their metadata.  Files the driver cannot see (a local
    membersDir on several hosts) are refused now, not at the first load."""
    manifest = store.commit(metas)
    missing = store.missing(m["file"] for m in manifest["objects"])
    if missing:
        raise ConfigurationError(
            f"membersDir: the driver cannot see {len(missing)} member files the executors wrote to "
            f"{store.uri} (e.g. {missing[0]}); use storage every executor and the driver share "
            "(s3://, hdfs://, /dbfs/...)"
        )
    return manifest["objects"]


_open: Dict[str, ModelStore] = {}  # the stores this process has read members from, by uri


def decode_stored(uri: str, meta: dict, trusted_types: Sequence[str] = ()) -> Any:
    """One object of the committed store at ``uri`` (the file's ``meta``), its SHA-256 checked and
    decoded through the safe formats: the one way a lazily held member is loaded (a bagging or
    grouped model's :class:`LazyMembers`, a
    :class:`~sparkml_dist.ensemble.group_models.GroupMember`'s ``model``)."""
    store = _open.get(uri)
    if store is None:
        store = _open[uri] = ModelStore(uri)
    return store.decode(meta, trusted_types)


class LazyMembers(Sequence):
    """The members of a committed store, loaded on access (see the module docstring)."""

    def __init__(self, uri: str, objects: Sequence[dict], trusted_types: Sequence[str] = ()) -> None:
        self.uri = uri
        self.trusted_types = tuple(trusted_types)
        by_group: Dict[int, Dict[int, dict]] = {}
        for meta in objects:
            by_group.setdefault(int(meta["group"]), {})[int(meta["item"])] = meta
        self._metas: List[Tuple[dict, dict]] = [
            (by_group[g][RECORD], by_group[g][MODEL]) for g in sorted(by_group) if g >= 0
        ]
        self._loaded: "List[Any] | None" = None

    def __getstate__(self):  # the metadata travels, never the models
        return {"uri": self.uri, "metas": self._metas, "trusted": self.trusted_types}

    def __setstate__(self, state):
        self.uri, self._metas, self.trusted_types = state["uri"], state["metas"], state["trusted"]
        self._loaded = None

    @property
    def records(self) -> List[dict]:
        """Each member's record (group, features, classes, n_rows), from the metadata alone."""
        return [rec.get("record") or {} for rec, _ in self._metas]

    def __len__(self) -> int:
        return len(self._metas)

    def _load(self, i: int) -> Any:
        rec, mod = self._metas[i]
        return from_record(
            decode_stored(self.uri, rec, self.trusted_types), decode_stored(self.uri, mod, self.trusted_types)
        )

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._loaded is not None:
            return self._loaded[i]
        return self._load(range(len(self))[i])

    def __iter__(self) -> Iterator[Any]:
        if self._loaded is not None:
            yield from self._loaded
            return
        for i in range(len(self)):
            yield self._load(i)  # one at a time: the caller drops it before the next

    def loaded(self) -> List[Any]:
        """Every member, loaded once and kept (an executor scoring batches)."""
        if self._loaded is None:
            self._loaded = [self._load(i) for i in range(len(self))]
        return self._loaded
