"""Horovod's Keras API on Keras 3's torch backend: ``import sparkml_dist.keras as hvd``.  [rank]

A Horovod + Keras program runs with its import changed. Horovod does not build against
TensorFlow >= 2.16 (Keras 3). This module gives a Keras 3 program
the names a Horovod Keras program uses — :func:`init`, :func:`size`, :func:`rank`,
:func:`local_rank`, :func:`local_size`, :func:`DistributedOptimizer`, :mod:`.callbacks`,
:func:`allreduce`, :func:`allgather`, :func:`broadcast`, :func:`broadcast_variables`,
:func:`load_model` — over the runner's torch.distributed group (gloo on CPU, NCCL on GPUs), so
``model.fit()`` trains data-parallel::

    def train(learning_rate=1.0):
        import keras
        import sparkml_dist.keras as hvd          # was: import horovod.keras as hvd

        hvd.init()
        model = keras.Sequential([...])
        opt = hvd.DistributedOptimizer(keras.optimizers.Adadelta(learning_rate * hvd.size()))
        model.compile(optimizer=opt, loss="categorical_crossentropy", metrics=["accuracy"])
        model.fit(x, y, batch_size=128, epochs=4,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
                  verbose=1 if hvd.rank() == 0 else 0)
        return model.get_weights()

    weights = HorovodRunner(np=2).run(train)      # or BarrierRunner(np=2).run(train)

Keras must run on the torch backend: the runner sets ``KERAS_BACKEND=torch`` for its torch ranks
(unless the environment sets another), and importing this module before ``keras`` sets it too.
A Keras already imported on another backend is refused with the fix. Outside the runner,
:func:`init` joins a ``torchrun`` environment's group, or runs as a world of one.
"""

from __future__ import annotations

import os
import sys

from ..errors import ConfigurationError


def _check_keras() -> None:
    """Keras 3 on the torch backend, or a ConfigurationError that names what to change."""
    chosen = "keras" not in sys.modules and "KERAS_BACKEND" not in os.environ
    if chosen:  # for this import only: processes this one starts keep the environment they had
        os.environ["KERAS_BACKEND"] = "torch"
    try:
        import keras
    except ImportError as exc:
        raise ConfigurationError(
            f"sparkml_dist.keras needs Keras 3 and torch ({exc}): pip install 'sparkml_dist[keras]'"
        ) from None
    finally:
        if chosen:
            os.environ.pop("KERAS_BACKEND", None)
    version = getattr(keras, "__version__", "0")
    if int(version.split(".")[0]) < 3:
        raise ConfigurationError(
            f"sparkml_dist.keras needs Keras 3 (this is Keras {version}). A tf.keras (Keras 2) program "
            "runs under backend='tensorflow' with tf.distribute.MultiWorkerMirroredStrategy"
        )
    keras_backend = keras.backend.backend()
    if keras_backend != "torch":
        raise ConfigurationError(
            f"sparkml_dist.keras runs Keras 3 on the torch backend, but this process's Keras uses "
            f"{keras_backend!r} (KERAS_BACKEND={os.environ.get('KERAS_BACKEND')!r}). Set KERAS_BACKEND=torch "
            "before keras is imported (the runner does for backend='torch' unless env= or the "
            "executors' environment sets another). A tf.keras program runs under "
            "backend='tensorflow' with MultiWorkerMirroredStrategy; Keras on JAX under backend='jax' "
            "with keras.distribution.DataParallel"
        )


_check_keras()

from . import callbacks  # noqa: E402 - after the backend check: it imports keras
from ._collectives import Compression  # noqa: E402
from ._optimizer import DistributedOptimizer, load_model  # noqa: E402
from ._ranks import (  # noqa: E402
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from ._values import Adasum, Average, Sum, allgather, allreduce, broadcast, broadcast_variables  # noqa: E402

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Sum",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_variables",
    "callbacks",
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]
