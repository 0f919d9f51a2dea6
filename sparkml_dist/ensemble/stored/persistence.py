"""pyspark.ml save/load for every sparkml_dist stage (bagging and grouped, estimators and models).  [driver]

Layout of a saved stage::

    <path>/metadata/            pyspark.ml metadata (class, uid, JSON params) written by Spark
    <path>/data/manifest.json   the model store's manifest: every file's format, size and SHA-256,
                                the SHA-256 of the stage's metadata and, when saved with a signing
                                key, the HMAC-SHA256 of all that
    <path>/data/objects/...     group -1: the base estimator; group g >= 0: member g's record
                                (item 0, JSON) and its model (item 1)

Loading runs no code from the files (see :mod:`sparkml_dist.formats`): the stage class is
looked up in a fixed registry (:data:`STAGES`), member records are JSON, models are read with
``skops`` against an explicit list of trusted types, or in XGBoost's own format, and every tree
structure is validated before use (:mod:`sparkml_dist.formats.checks`).  A signed model
is checked against the key in ``SPARKML_DIST_MODEL_KEY`` (or ``.signed_with(key)``).  Models saved
by sparkml_dist 0.1 (pickles) load only with ``.allow_pickle()``.

Example::

    model.write().overwrite().signed_with(key).save(path)
    BaggingClassificationModel.read().trusted_types(["mypkg.MyEstimator"]).load(path)
    BaggingClassificationModel.read().allow_pickle().load(old_path)   # an old model you trust
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import json
import logging
import os
import posixpath
import uuid
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from ...errors import ConfigurationError
from ...formats import UnsafeModelError
from ...formats import store as model_store
from ..member_records import ESTIMATOR_GROUP, MODEL, RECORD, from_record, write_member
from .key_blocks import BLOCK_ITEM

log = logging.getLogger(__name__)


# the only classes a saved stage may name: its metadata selects one of these, never an import path
_ENSEMBLE = "sparkml_dist.ensemble"
STAGES = {
    f"{_ENSEMBLE}.{module}.{name}": (f"{_ENSEMBLE}.{home}", name)
    for module, home, names in (
        ("estimator", "estimator", ("BaggingClassifier", "BaggingRegressor")),
        ("models", "models", ("BaggingClassificationModel", "BaggingRegressionModel")),
        ("estimator", "models", ("BaggingClassificationModel", "BaggingRegressionModel")),  # saved by 0.1
        ("grouped", "grouped", ("GroupedTrainer",)),
        ("grouped", "grouped_model", ("GroupedModel",)),  # saved before it had a module of its own
        ("grouped_model", "grouped_model", ("GroupedModel",)),
        ("global_forest", "global_forest", ("GlobalForestClassifier", "GlobalForestRegressor")),
    )
    for name in names
}


def _data_dir(path: str) -> str:
    return posixpath.join(path, "data")


def metadata_digest(metadata: dict) -> str:
    """SHA-256 of what a load restores from the metadata (class, uid, params, sparkml_dist state)."""
    keys = ("class", "uid", "paramMap", "defaultParamMap", "sparkml_dist")
    canonical = json.dumps({k: metadata.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------- writer
class _StageWriter(MLWriter):
    def __init__(self, instance) -> None:
        super().__init__()
        self.instance = instance
        self._key: Optional[Union[str, bytes]] = None
        self._allow_pickle = False

    def signed_with(self, key: Union[str, bytes]) -> "_StageWriter":
        """Sign the saved model with ``key`` (HMAC-SHA256 over its manifest); default:
        ``SPARKML_DIST_MODEL_KEY`` when set."""
        self._key = key
        return self

    def allow_pickle(self) -> "_StageWriter":
        """Save members that no safe format can hold as pickles (loading them will need
        ``allow_pickle`` too)."""
        self._allow_pickle = True
        return self

    def save(self, path: str) -> None:
        """Save to ``path``; with ``overwrite()`` an existing model is replaced only once the new one
        is complete (written beside it, then swapped in by renames), so a failed or concurrent save
        never leaves a half-written model or none at all where a whole one was."""
        from pyarrow import fs as pafs

        fs, root = model_store.filesystem(path)
        if not self.shouldOverwrite or fs.get_file_info(root).type == pafs.FileType.NotFound:
            self.saveImpl(path)
            return
        if not isinstance(fs, (pafs.LocalFileSystem, pafs.HadoopFileSystem)):  # no directory renames
            log.warning("overwriting %s in place: this file system cannot swap directories", path)
            fs.delete_dir(root)
            self.saveImpl(path)
            return
        parent, name = posixpath.split(path.rstrip("/"))
        tag = uuid.uuid4().hex[:12]
        staging = posixpath.join(parent, f".{name}.saving-{tag}")
        old = posixpath.join(posixpath.dirname(root.rstrip("/")), f".{name}.replaced-{tag}")
        staged = model_store.filesystem(staging)[1]
        try:
            self.saveImpl(staging)
        except BaseException:
            if fs.get_file_info(staged).type != pafs.FileType.NotFound:
                fs.delete_dir(staged)
            raise
        fs.move(root, old)
        fs.move(staged, root)
        fs.delete_dir(old)

    def saveImpl(self, path: str) -> None:
        inst = self.instance
        params = {p.name: v for p, v in inst._paramMap.items() if p.name != "estimator"}
        extra = {"sparkml_dist": inst._persisted_state()}
        DefaultParamsWriter.saveMetadata(inst, path, self.sparkSession, extraMetadata=extra, paramMap=params)
        digest = metadata_digest(DefaultParamsReader.loadMetadata(path, self.sparkSession))
        store = model_store.ModelStore(_data_dir(path), key=self._key)
        write = lambda g, i, obj: store.write(g, i, obj, allow_pickle=self._allow_pickle)  # noqa: E731
        metas = []
        if inst.getEstimator() is not None:
            metas.append(write(ESTIMATOR_GROUP, 0, inst.getEstimator()))
        metas += inst._saved_members(store, write)
        store.commit(metas, extra={"metadata_sha256": digest})


# --------------------------------------------------------------------------- reader
class _StageReader(MLReader):
    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls
        self._trusted: Tuple[str, ...] = ()
        self._allow_pickle = False
        self._key: Optional[Union[str, bytes]] = None
        self._lazy = False

    def lazy(self) -> "_StageReader":
        """Leave a bagging model's members in the saved store and load them when used: one at a
        time on the driver (``predict``, saving), once per executor Python worker (``transform``)."""
        self._lazy = True
        return self

    def trusted_types(self, types: Iterable[str]) -> "_StageReader":
        """Also construct these types (fully qualified names, e.g. ``"mypkg.models.MyEstimator"``)
        when loading members with skops; see :mod:`sparkml_dist.formats`."""
        self._trusted = tuple(types)
        return self

    def allow_pickle(self) -> "_StageReader":
        """Load members stored as pickles (models saved by sparkml_dist 0.1, or with
        ``write().allow_pickle()``). A pickle runs code when loaded: only for files you trust."""
        self._allow_pickle = True
        return self

    def signed_with(self, key: Union[str, bytes]) -> "_StageReader":
        """Refuse the model unless it is signed with ``key`` (default ``SPARKML_DIST_MODEL_KEY``)."""
        self._key = key
        return self

    def load(self, path: str):
        metadata = _load_metadata(path, self)
        cls_name = metadata.get("class")
        if cls_name not in STAGES:
            raise UnsafeModelError(
                f"{path!r} names stage class {cls_name!r}, which is not a sparkml_dist "
                f"stage; it can be loaded only as one of {sorted(STAGES)}"
            )
        module, name = STAGES[cls_name]
        store = model_store.ModelStore(_data_dir(path), key=self._key)
        manifest = store.manifest()
        if manifest.get("metadata_sha256") not in (None, metadata_digest(metadata)):
            raise UnsafeModelError(
                f"the metadata of {path!r} does not match its manifest: it was "
                "modified after the model was saved"
            )
        if store.signed and manifest.get("metadata_sha256") is None:
            raise UnsafeModelError(f"{path!r} is signed but its manifest does not cover its metadata")
        if any(m.get("item") == BLOCK_ITEM for m in manifest["objects"]):  # a model of many keys
            from .key_models import KeyModels

            members = KeyModels.load(store, manifest["objects"], self._trusted)  # the blocks stay there
            return self._restored(module, name, metadata, members, self._estimator(store, manifest))
        lazy = self._lazy and name.startswith("Bagging") and name.endswith("Model")
        if self._lazy and not lazy:
            raise ConfigurationError(f"read().lazy() loads bagging models only, not {name}")
        if lazy and (self._allow_pickle or manifest.get("format") == model_store.ModelStore.FORMAT_V1):
            raise ConfigurationError("read().lazy() loads members in safe formats only: drop allow_pickle()")
        if lazy:
            from .member_store import LazyMembers

            members = LazyMembers(store.uri, manifest["objects"], self._trusted)
            objects = {k: v for k, v in [((ESTIMATOR_GROUP, 0), self._estimator(store, manifest))] if v}
        else:
            objects = store.load_all(trusted_types=self._trusted, allow_pickle=self._allow_pickle)
        estimator = objects.pop((ESTIMATOR_GROUP, 0), None)
        return self._restored(
            module, name, metadata, members if lazy else _members(objects, manifest), estimator
        )

    @staticmethod
    def _restored(module: str, name: str, metadata: dict, members: Any, estimator: Any):
        instance = getattr(importlib.import_module(module), name)()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        if estimator is not None:
            instance._set(estimator=estimator)
        instance._restore_state(metadata.get("sparkml_dist", {}), members)
        return instance

    def _estimator(self, store, manifest: dict) -> Any:
        if not any(m["group"] == ESTIMATOR_GROUP for m in manifest["objects"]):
            return None
        return store.load(ESTIMATOR_GROUP, 0, trusted_types=self._trusted)


def load_stage(path: str):
    """The sparkml_dist stage saved at ``path``, whichever it is (its metadata names it, from the
    fixed registry :data:`STAGES`), loaded as ``Stage.load`` would."""
    return _StageReader(None).load(path)


def _load_metadata(path: str, reader: MLReader) -> dict:
    """The stage's pyspark.ml metadata: read straight from a local directory (so MLflow's pyfunc
    loads a model with no Spark session), through Spark for other file systems."""
    local = path[len("file:") :] if path.startswith("file:") else (None if "://" in path else path)
    if local is not None:
        while local.startswith("//"):
            local = local[1:]
        parts = sorted(glob.glob(os.path.join(local, "metadata", "part-*")))
        if parts:
            with open(parts[0], encoding="utf-8") as fh:
                return json.loads(fh.readline())
    return DefaultParamsReader.loadMetadata(path, reader.sparkSession)


def _members(objects: Dict[Tuple[int, int], Any], manifest: dict) -> List[Any]:
    """Members from (record, model) pairs; a store of sparkml_dist 0.1 held pickled members."""
    if manifest.get("format") == model_store.ModelStore.FORMAT_V1:
        return [objects[k] for k in sorted(objects)]
    groups = sorted({g for g, _ in objects})
    missing = [g for g in groups if (g, RECORD) not in objects or (g, MODEL) not in objects]
    if missing:
        raise UnsafeModelError(f"members {missing} lack their record or model in the saved model")
    return [from_record(objects[(g, RECORD)], objects[(g, MODEL)]) for g in groups]


class StageReadWrite(MLWritable, MLReadable):
    """Mixin: ``write()``/``save()`` and ``read()``/``load()`` for sparkml_dist stages: params as
    pyspark.ml metadata, the estimator and members in a model store, and the stage's own state (see
    ``_persisted_state`` / ``_restore_state``)."""

    def write(self) -> _StageWriter:
        return _StageWriter(self)

    @classmethod
    def read(cls) -> _StageReader:
        return _StageReader(cls)

    def _saved_members(self, store, write) -> List[dict]:
        """The members written into a saved model's ``store`` (``write(group, item, obj)``), one
        loaded at a time; their metadata."""
        return [meta for m in getattr(self, "_members", []) for meta in write_member(write, m)]

    def _persisted_state(self) -> dict:
        if not hasattr(self, "_members"):
            return {}
        return {
            "n_features": self._n_features,
            "classes": list(self._classes) if self._classes is not None else None,
        }

    def _restore_state(self, state: dict, members: list) -> None:
        if hasattr(self, "_members"):
            self._members = members
            self._n_features = int(state.get("n_features", 0))
            classes = state.get("classes")
            self._classes = tuple(classes) if classes is not None else None
