"""A drop-in ``MirroredStrategyRunner``: spark-tensorflow-distributor's API.  [driver]

spark-tensorflow-distributor has not been maintained since 2022; its programs run on this
package's runner after changing only the import::

    # from spark_tensorflow_distributor import MirroredStrategyRunner
    from sparkml_dist.tensorflow_distributor import MirroredStrategyRunner

    def train(epochs):
        import tensorflow as tf
        model = tf.keras.Sequential([...])           # built inside the strategy's scope
        model.compile(optimizer="sgd", loss="mse")
        model.fit(dataset, epochs=epochs)
        return model.get_weights()                   # rank 0's value comes back

    weights = MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train, epochs=3)

Semantics kept: ``num_slots`` workers (GPUs with ``use_gpu``, the default as there; else task
slots); ``local_mode=True`` runs them on the driver; unless ``use_custom_strategy=True`` the
function runs inside ``tf.distribute.MultiWorkerMirroredStrategy().scope()`` (NCCL on GPUs, ring
all-reduce on CPUs), else it builds its own strategy; ``run`` returns the first worker's return
value.  Each worker is a rank of :class:`sparkml_dist.runner.BarrierRunner` with
``backend="tensorflow"`` (its ``TF_CONFIG``, ``TF_USE_LEGACY_KERAS=1``): logs stream to the cell,
a failure names its rank with its traceback, and ``timeout=``, ``max_restarts=``, ``env=`` ...
pass as keywords.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import ConfigurationError

__all__ = ["MirroredStrategyRunner"]


def in_strategy(train_fn: Callable, use_gpu: bool, kwargs: dict) -> Any:
    """On a rank: ``train_fn(**kwargs)`` inside a MultiWorkerMirroredStrategy's scope."""
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=impl.NCCL if use_gpu else impl.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        return train_fn(**kwargs)


class MirroredStrategyRunner:
    """spark-tensorflow-distributor's ``MirroredStrategyRunner``, backed by ``BarrierRunner``.

    Args:
        num_slots: workers: GPUs with ``use_gpu``, else Spark task slots (processes with
            ``local_mode``).
        local_mode: run the workers as processes on the driver, not as Spark tasks.
        use_gpu: one GPU per worker (default True, as there).
        gpu_resource_name: Spark's resource name of GPUs; ``"gpu"`` (the runner schedules that one).
        use_custom_strategy: the function makes its own strategy (``TF_CONFIG`` is set for it).
        **options: passed to ``BarrierRunner`` (``spark``, ``timeout``, ``max_restarts``, ``env``, ...).
    """

    def __init__(
        self,
        *,
        num_slots: int,
        local_mode: bool = False,
        use_gpu: bool = True,
        gpu_resource_name: str = "gpu",
        use_custom_strategy: bool = False,
        **options: Any,
    ) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
            raise ConfigurationError(f"num_slots must be a positive integer, got {num_slots!r}")
        if gpu_resource_name != "gpu":
            raise ConfigurationError(
                f"gpu_resource_name={gpu_resource_name!r}: the runner schedules Spark's 'gpu' resource "
                "(spark.task.resource.gpu.amount); name your cluster's GPUs 'gpu'"
            )
        for reserved in ("np", "backend"):
            if reserved in options:
                raise ConfigurationError(
                    f"MirroredStrategyRunner sets {reserved!r} itself; use "
                    "sparkml_dist.runner.BarrierRunner(..., backend='tensorflow') to choose it"
                )
        self.num_slots, self.local_mode, self.use_gpu = num_slots, bool(local_mode), bool(use_gpu)
        self.gpu_resource_name, self.use_custom_strategy = gpu_resource_name, bool(use_custom_strategy)
        self._options = options

    def run(self, train_fn: Callable, **kwargs: Any) -> Any:
        """Run ``train_fn(**kwargs)`` on every worker; returns the first worker's return value."""
        return self._run(None, train_fn, kwargs)

    def run_with_data(self, df, train_fn: Callable, **kwargs: Any) -> Any:
        """As :meth:`run`, each worker reading its shard of ``df`` with
        ``sparkml_dist.runner.shard()`` (``shard().to_tf_dataset(...)``: a ``tf.data.Dataset``)."""
        return self._run(df, train_fn, kwargs)

    def _run(self, df, train_fn: Callable, kwargs: dict) -> Any:
        from .runner import BarrierRunner

        if not callable(train_fn):
            raise ConfigurationError(f"train_fn must be a function, got {type(train_fn).__name__}")
        np_ = -self.num_slots if self.local_mode else self.num_slots
        runner = BarrierRunner(np_, backend="tensorflow", use_gpu=self.use_gpu, **self._options)
        main, args = (
            (train_fn, ()) if self.use_custom_strategy else (in_strategy, (train_fn, self.use_gpu, kwargs))
        )
        kwargs = kwargs if self.use_custom_strategy else {}
        if df is None:
            return runner.run(main, *args, **kwargs)
        return runner.run_with_data(df, main, *args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"MirroredStrategyRunner(num_slots={self.num_slots}, local_mode={self.local_mode}, "
            f"use_gpu={self.use_gpu}, use_custom_strategy={self.use_custom_strategy})"
        )
