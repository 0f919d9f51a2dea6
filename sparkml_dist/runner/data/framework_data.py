"""A rank's shard as Keras and TensorFlow input: ``to_keras()``, ``to_tf_dataset()``.  [rank]

Both come from the shard's own loader (:mod:`.loader`), so every rank yields the same number of
batches per epoch (a rank that ran out first would leave the others waiting in an all-reduce),
in the run's global sample order, reshuffled each epoch:

* :func:`keras_data` — a ``keras.utils.PyDataset`` for ``model.fit`` on any Keras 3 backend
  (torch with :mod:`sparkml_dist.keras`, JAX with ``DataParallel``); each epoch's batches are
  built when the epoch starts, so it holds the shard once, as ``fit(x, y)`` on arrays would.
  ``fit``'s ``shuffle=True`` (its default) leaves their order alone: Keras would shuffle the
  batch order with each process's own random state, so the ranks would take different batches at
  a step (rows of other steps, and a short last batch averaged as if it were full); the loader
  already reshuffles the rows each epoch (``shuffle=``, ``seed=``), the same way on every rank;
* :func:`tf_dataset` — a ``tf.data.Dataset`` streamed from the loader, its cardinality known.
  Its batches are *per rank* (the global batch is ``batch_size`` x the number of ranks), which is
  not what ``MultiWorkerMirroredStrategy`` assumes of a dataset: it takes a dataset's batch as the
  global one and splits it over the workers, so ``fit`` would train half of each rank's rows an
  epoch on 2 ranks. So this module teaches the strategy one thing, once a rank has made such a
  dataset: a dataset that comes from one (``.map``, ``.prefetch`` ... included) is distributed as
  ``distribute_datasets_from_function`` distributes a worker's own per-replica batches (each
  rank's batch split over its own replicas, when it has several GPUs). A dataset built another way
  keeps TensorFlow's rule.

``x`` and ``y`` name columns: one column gives its values as they are ((b,) or (b, d) for a
vector or list column), several are set side by side as (b, d1 + d2 + ...).

Example::

    data = shard().to_keras(batch_size=64, x="features", y="label")
    model.fit(data, epochs=3)
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Union

import numpy as np

from ...errors import ConfigurationError

Columns = Union[str, Sequence[str]]


def _names(columns: Columns, what: str, known: List[str]) -> List[str]:
    names = [columns] if isinstance(columns, str) else list(columns or [])
    if not names and what == "x":
        raise ConfigurationError("x: name the feature column(s), e.g. x='features' or x=['f1', 'f2']")
    missing = [c for c in names if c not in known]
    if missing:
        raise ConfigurationError(f"{what}={columns!r}: no column {missing} in the shard; it has {known}")
    return names


def _stack(values: dict, names: List[str]) -> np.ndarray:
    if len(names) == 1:
        return values[names[0]]
    parts = [np.asarray(values[c]).reshape(len(values[c]), -1) for c in names]
    return np.concatenate(parts, axis=1)


def _batches(shard, batch_size: int, x: Columns, y, shuffle: bool, seed: int, drop_last: bool):
    """The loader of (x,) or (x, y) numpy batches, and the column lists."""
    xs = _names(x, "x", shard.column_names)
    ys = _names(y, "y", shard.column_names) if y is not None else []

    def to_xy(values: dict):
        return (_stack(values, xs), _stack(values, ys)) if ys else (_stack(values, xs),)

    loader = shard.dataloader(
        batch_size, xs + ys, shuffle=shuffle, seed=seed, drop_last=drop_last, transform=to_xy
    )
    return loader, xs, ys


def keras_data(shard, batch_size: int, x: Columns, y=None, shuffle=True, seed=0, drop_last=False):
    """A ``keras.utils.PyDataset`` of the shard's (x, y) batches; see the module docstring."""
    import keras

    shard._check_fits(
        _names(x, "x", shard.column_names) + ([] if y is None else _names(y, "y", shard.column_names)),
        "to_keras()",
    )
    loader, _, _ = _batches(shard, batch_size, x, y, shuffle, seed, drop_last)

    class ShardBatches(keras.utils.PyDataset):
        """This rank's batches of one epoch, by index (Keras may ask in any order, or peek)."""

        def __init__(self) -> None:
            super().__init__(workers=1, use_multiprocessing=False)
            self._epoch: List = []

        @property
        def num_batches(self) -> int:
            return len(loader)

        def __len__(self) -> int:
            return len(loader)

        def __getitem__(self, index: int):
            if not self._epoch:
                self._epoch = list(loader)  # the next epoch of the global order
            return self._epoch[index]

        def on_epoch_end(self) -> None:
            self._epoch = []

    _keep_batch_order()
    batches = ShardBatches()
    batches._sparkml_dist_ordered = True  # what _keep_batch_order looks for
    return batches


def _keep_batch_order() -> None:
    """Keras's ``fit(shuffle=True)`` leaves this module's PyDatasets in their order (see the
    module docstring); installed once per process."""
    from keras.src.trainers.data_adapters import py_dataset_adapter

    adapter = py_dataset_adapter.PyDatasetAdapter
    original = adapter.__init__
    if getattr(original, "_sparkml_dist_hook", False):
        return

    def __init__(self, x, class_weight=None, shuffle=False):
        ordered = getattr(x, "_sparkml_dist_ordered", False)
        original(self, x, class_weight=class_weight, shuffle=shuffle and not ordered)

    __init__._sparkml_dist_hook = True  # type: ignore[attr-defined]
    adapter.__init__ = __init__


def tf_dataset(shard, batch_size: int, x: Columns, y=None, shuffle=True, seed=0, drop_last=False):
    """A ``tf.data.Dataset`` of the shard's (x, y) batches; see the module docstring."""
    import tensorflow as tf

    loader, xs, ys = _batches(shard, batch_size, x, y, shuffle, seed, drop_last)
    first, _, _ = _batches(shard, batch_size, x, y, False, seed, drop_last)
    sample = next(iter(first), None)
    first.close()
    if sample is None:
        raise ConfigurationError(f"rank {shard.rank} received an empty shard: lower np or add data")

    def spec(a: np.ndarray):
        return tf.TensorSpec(shape=(None,) + a.shape[1:], dtype=tf.as_dtype(a.dtype))

    signature = tuple(spec(a) for a in sample)
    make: Callable = lambda: iter(loader)  # noqa: E731 - each pass over the dataset: the next epoch
    dataset = tf.data.Dataset.from_generator(make, output_signature=signature)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(loader)))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    dataset._sparkml_dist_per_rank = True  # noqa: SLF001 - what _per_rank looks for
    _distribute_per_rank()
    return dataset


def _per_rank(dataset) -> bool:
    """Does ``dataset`` come from a :func:`tf_dataset` (itself, or a ``map``/``prefetch``/... of it)?"""
    todo, seen = [dataset], set()
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        if getattr(d, "_sparkml_dist_per_rank", False):
            return True
        todo.extend(getattr(d, "_inputs", lambda: [])())
    return False


def _replica_batches(dataset, replicas: int):
    """Each of ``dataset``'s batches cut into ``replicas`` consecutive parts (sizes within one row)."""
    import tensorflow as tf

    if replicas == 1:
        return dataset

    def parts(*batch):
        n = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]

        def part(i):
            lo, hi = n * i // replicas, n * (i + 1) // replicas
            return tf.nest.map_structure(lambda t: t[lo:hi], batch)

        return tf.data.Dataset.range(replicas).map(part)

    return dataset.flat_map(parts)


def _distribute_per_rank() -> None:
    """MultiWorkerMirroredStrategy distributes this module's datasets as per-rank batches (see the
    module docstring); installed once per process."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

    extended = mwms.CollectiveAllReduceExtended
    original = extended._experimental_distribute_dataset
    if getattr(original, "_sparkml_dist_hook", False):
        return

    def distribute(self, dataset, options):
        if not _per_rank(dataset):
            return original(self, dataset, options)
        replicas = len(self.worker_devices)
        return self._distribute_datasets_from_function(
            lambda context: _replica_batches(dataset, replicas), options
        )

    distribute._sparkml_dist_hook = True  # type: ignore[attr-defined]
    extended._experimental_distribute_dataset = distribute
