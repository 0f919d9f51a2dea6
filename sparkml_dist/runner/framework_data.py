"""A rank's shard as Keras and TensorFlow input: ``to_keras()``, ``to_tf_dataset()``.  [rank]

Both come from the shard's own loader (:mod:`.loader`), so every rank yields the same number of
batches per epoch (a rank that ran out first would leave the others waiting in an all-reduce),
in the run's global sample order, reshuffled each epoch:

* :func:`keras_data` — a ``keras.utils.PyDataset`` for ``model.fit`` on any Keras 3 backend
  (torch with :mod:`sparkml_dist.keras`, JAX with ``DataParallel``); each epoch's batches are
  built when the epoch starts, so it holds the shard once, as ``fit(x, y)`` on arrays would;
* :func:`tf_dataset` — a ``tf.data.Dataset`` streamed from the loader, with auto-sharding off
  (the rows are already this rank's: ``MultiWorkerMirroredStrategy`` must not split them again)
  and its cardinality known.

``x`` and ``y`` name columns: one column gives its values as they are ((b,) or (b, d) for a
vector or list column), several are set side by side as (b, d1 + d2 + ...).

Example::

    data = shard().to_keras(batch_size=64, x="features", y="label")
    model.fit(data, epochs=3)
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Union

import numpy as np

from ..errors import ConfigurationError

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

    return ShardBatches()


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
    return dataset.with_options(options)
