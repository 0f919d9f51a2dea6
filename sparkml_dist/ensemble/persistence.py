"""pyspark.ml save/load for every sparkml_dist stage (bagging and grouped, estimators and models).  [driver]

Layout of a saved stage::

    <path>/metadata/          pyspark.ml metadata (class, uid, JSON params) written by Spark
    <path>/data/manifest.json the model store's manifest (sizes, SHA-256 checksums)
    <path>/data/objects/...   group -1: the base estimator; group g >= 0: member g

It is what ``DefaultParamsWriter`` writes plus a :class:`~sparkml_dist.collection.ModelStore`, so
a saved ``Pipeline``/``PipelineModel`` holding these stages loads with ``PipelineModel.load``.
Pickled objects are read with the allowlisting loader (see :mod:`sparkml_dist.serialization`);
for your own estimator classes set ``SPARKML_DIST_TRUSTED_MODULES`` or call
``BaggingClassificationModel.read().trusted(["mypackage"]).load(path)``.
"""

from __future__ import annotations

import posixpath
from typing import Iterable

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from .. import collection, serialization
from ..errors import ConfigurationError

_ESTIMATOR_GROUP = -1


def _data_dir(path: str) -> str:
    return posixpath.join(path, "data")


class _StageWriter(MLWriter):
    def __init__(self, instance) -> None:
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:  # works on classic and Connect alike
        fs, root = collection._filesystem(path)
        from pyarrow import fs as pafs

        if fs.get_file_info(root).type != pafs.FileType.NotFound:
            fs.delete_dir(root)

    def saveImpl(self, path: str) -> None:
        inst = self.instance
        params = {p.name: v for p, v in inst._paramMap.items() if p.name != "estimator"}
        extra = {"sparkml_dist": inst._persisted_state()}
        DefaultParamsWriter.saveMetadata(inst, path, self.sparkSession, extraMetadata=extra, paramMap=params)
        store = collection.ModelStore(_data_dir(path))
        metas = []
        est = inst.getEstimator()
        if est is not None:
            metas.append(store.write_bytes(_ESTIMATOR_GROUP, 0, serialization.dumps(est)))
        for m in getattr(inst, "_members", []):
            metas.append(store.write_bytes(m.group, 0, serialization.dumps(m)))
        store.commit(metas)


class _StageReader(MLReader):
    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls
        self._trusted: tuple = ()

    def trusted(self, modules: Iterable[str]) -> "_StageReader":
        """Also allow classes from these top-level modules when unpickling members."""
        self._trusted = tuple(modules)
        return self

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        cls_name = metadata["class"]
        module, _, name = cls_name.rpartition(".")
        if not module.startswith("sparkml_dist."):
            raise ConfigurationError(f"{path!r} holds a {cls_name}, not a sparkml_dist stage")
        import importlib

        py_type = getattr(importlib.import_module(module), name)
        instance = py_type()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        objects = collection.ModelStore(_data_dir(path)).load_all(trusted_modules=self._trusted)
        if (_ESTIMATOR_GROUP, 0) in objects:
            instance._set(estimator=objects.pop((_ESTIMATOR_GROUP, 0)))
        instance._restore_state(metadata.get("sparkml_dist", {}), [objects[k] for k in sorted(objects)])
        return instance


class StageReadWrite(MLWritable, MLReadable):
    """Mixin: ``write()``/``save()`` and ``read()``/``load()`` for sparkml_dist stages: params as pyspark.ml
    metadata, the estimator and members in a model store, and the stage's own state (see
    ``_persisted_state`` / ``_restore_state``)."""

    def write(self) -> MLWriter:
        return _StageWriter(self)

    @classmethod
    def read(cls) -> _StageReader:
        return _StageReader(cls)

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
