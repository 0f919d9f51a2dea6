"""Horovod's Keras callbacks for Keras 3 on the torch backend.  [rank]

* :class:`BroadcastGlobalVariablesCallback` — rank 0's weights and optimizer state on every rank
  when training begins, so ranks that built their models from different seeds start equal;
* :class:`MetricAverageCallback` — each epoch's metrics averaged over the ranks (put it before
  callbacks that read them: checkpoints, early stopping, loggers);
* :class:`LearningRateWarmupCallback` — the learning rate ramps from ``initial_lr / size()`` to
  ``initial_lr`` over the first epochs (Goyal et al.'s warmup for large global batches);
* :class:`LearningRateScheduleCallback` — ``initial_lr * multiplier(epoch)`` between two epochs.

Example::

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3, verbose=1),
    ]
    model.fit(x, y, callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)
"""

from __future__ import annotations

import numbers
from typing import Callable, Optional, Union

import keras
import numpy as np

from ..errors import ConfigurationError
from . import _ranks, _values


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Rank ``root_rank``'s model and optimizer variables on every rank, when ``fit`` begins."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None) -> None:
        if self.broadcast_done:
            return
        model = self.model
        variables = list(model.variables)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            variables += list(optimizer.variables)
        _values.broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Every numeric entry of an epoch's logs, averaged over the ranks (in place)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if not logs or not _ranks.distributed():
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, numbers.Number) or np.ndim(v) == 0)
        averaged = _values.allreduce(np.array([float(logs[k]) for k in keys], dtype=np.float64))
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


Multiplier = Union[float, Callable[[float], float]]


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """The learning rate ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to ``end_epoch``.

    ``staircase=True`` changes it at each epoch's first batch; ``False`` at every batch, with the
    epoch as a fraction (needs ``steps_per_epoch`` when ``fit`` cannot tell). With
    ``momentum_correction``, an optimizer's ``momentum`` is scaled by new/old rate for the batch
    where the rate changes (Goyal et al.).
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: Multiplier,
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
    ) -> None:
        super().__init__()
        if not isinstance(initial_lr, numbers.Number) or not initial_lr > 0:
            raise ConfigurationError(f"initial_lr must be a positive number, got {initial_lr!r}")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: float(multiplier))
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._restore_momentum: Optional[float] = None

    def _in_range(self, epoch: int) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_train_begin(self, logs=None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ConfigurationError(
                f"{type(self).__name__}: fit cannot tell the batches per epoch of this data; pass "
                "steps_per_epoch=... to the callback"
            )

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        if not self._in_range(self.current_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set(self.current_epoch)
        else:
            self._set(self.current_epoch + batch / float(self.steps_per_epoch))

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if self._restore_momentum is not None:
            self.model.optimizer.momentum = self._restore_momentum
            self._restore_momentum = None

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is not None:
            logs["lr"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def _set(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        new = self.initial_lr * float(self.multiplier(epoch))
        try:
            optimizer.learning_rate = new
        except TypeError as exc:  # a LearningRateSchedule cannot be set
            raise ConfigurationError(
                f"{type(self).__name__} sets the optimizer's learning rate, which is a schedule "
                f"here ({exc}); give the optimizer a number as its learning_rate"
            ) from None
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and isinstance(momentum, numbers.Number) and momentum and old > 0:
            self._restore_momentum = momentum
            optimizer.momentum = momentum * new / old


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """The rate from ``initial_lr / size()`` to ``initial_lr`` over ``warmup_epochs``, batch by batch."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            size = _ranks.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs, self.verbose = warmup_epochs, verbose

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and _ranks.rank() == 0:
            rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {rate:g}.")
