"""What a framework does once a step, seen by the rank's step clock, with no change to the function.  [rank]

:func:`install` (the rank process, before the function) arranges, each once its framework is
imported (nothing is imported for it):

* **torch's ``DistributedDataParallel``**: a training forward begins a step; every gradient
  bucket's all-reduce goes through a timed communication hook (the user's own hook, wrapped, or
  DDP's ``allreduce_hook`` registered at the first forward when the function registered none), and
  the time from the step's last bucket launched (the backward's own work done) to its last bucket
  landed (the peers' gradients in, the slowest peer's too) is the step's communication wait;
* **Horovod's ``DistributedOptimizer``** (``horovod.torch``): ``step`` begins a step and the time in
  ``synchronize`` (waiting for the all-reduces) is communication;
* **Keras ``fit``** (Keras 3, and ``tf.keras`` of ``tf-keras``): a callback the runner adds begins
  a step at each training batch and ends the last at the end of training;
* ``sparkml_dist.keras``'s ``DistributedOptimizer`` times its own all-reduces
  (:func:`timed_comm`).

Example::

    install()                                   # in the rank, before the user's function
    with timed_comm():
        allreduce_(grads, average=True)
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator, Optional

from ..backends.base import after_import
from .clock import CLOCK

_last_landed: Optional[float] = None  # when the last all-reduce of a DDP step landed (perf_counter)


def install() -> None:
    """Time each framework the function imports (see the module docstring)."""
    if not CLOCK.on:
        return
    after_import("torch.nn.parallel.distributed", _time_ddp)
    after_import("horovod.torch", _time_horovod)
    after_import("keras", _time_keras_fit)
    after_import("tf_keras", _time_keras_fit)


def last_landed() -> Optional[float]:
    """When the last DDP all-reduce landed: where a step the framework left open ends."""
    return _last_landed


@contextlib.contextmanager
def timed_comm() -> Iterator[None]:
    """The time inside counts as communication (a collective the step waits for)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        CLOCK.waited("comm", time.perf_counter() - start)


# ------------------------------------------------------------------ torch DistributedDataParallel
class _Buckets:
    """One step's buckets: when the last was launched and when the last landed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending, self.launched, self.all_launched = 0, 0.0, False

    def launch(self, index: int, last: bool) -> None:
        with self.lock:
            if index == 0 and self.pending == 0:  # the step's first bucket: a new step's waits
                self.all_launched = False
            self.pending += 1
            self.launched = time.perf_counter()
            self.all_launched = self.all_launched or last

    def land(self) -> None:
        global _last_landed
        now = time.perf_counter()
        with self.lock:
            self.pending -= 1
            if not (self.all_launched and self.pending == 0):
                return
            self.all_launched = False
            waited = max(0.0, now - self.launched)
        _last_landed = now
        CLOCK.waited("comm", waited)


def _timed_hook(hook):
    """``hook`` (a DDP communication hook), its buckets timed."""
    buckets = _Buckets()

    def timed(state, bucket):
        buckets.launch(bucket.index(), bucket.is_last())
        future = hook(state, bucket)
        # a callback beside the hook's future, not a future of its own (then()): DDP gets the
        # hook's future as it is, and a peer's loss fails it with the collective's own error
        future.add_done_callback(lambda _: buckets.land())
        return future

    return timed


def _time_ddp(module) -> None:
    ddp = module.DistributedDataParallel
    if getattr(ddp, "_sparkml_dist_timed", False):
        return
    init, register = ddp.__init__, ddp.register_comm_hook

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._sparkml_dist_hooked = False
        self._sparkml_dist_arm = self.register_forward_pre_hook(_ddp_forward)

    def register_comm_hook(self, state, hook):
        self._sparkml_dist_hooked = True
        return register(self, state, _timed_hook(hook))

    def _ddp_forward(net, _inputs):
        import torch

        if not getattr(net, "_sparkml_dist_hooked", True):  # the function registered none: DDP's own
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            net._sparkml_dist_hooked = True
            register(net, net.process_group, _timed_hook(default_hooks.allreduce_hook))
        if net.training and torch.is_grad_enabled():
            CLOCK.begin("hook")

    ddp.__init__, ddp.register_comm_hook, ddp._sparkml_dist_timed = __init__, register_comm_hook, True


# ------------------------------------------------------------------ Horovod's DistributedOptimizer
def _time_horovod(hvd) -> None:
    from horovod.torch import optimizer as hvd_optimizer

    cls = getattr(hvd_optimizer, "_DistributedOptimizer", None)
    if cls is None or getattr(cls, "_sparkml_dist_timed", False):
        return
    synchronize, step = cls.synchronize, cls.step

    def timed_synchronize(self, *args, **kwargs):
        with timed_comm():
            return synchronize(self, *args, **kwargs)

    def timed_step(self, *args, **kwargs):
        CLOCK.begin("hook")
        return step(self, *args, **kwargs)

    cls.synchronize, cls.step, cls._sparkml_dist_timed = timed_synchronize, timed_step, True


# ------------------------------------------------------------------ Keras fit
_CALLBACKS_AT = 5  # fit's callbacks, when given by position (after x, y, batch_size, epochs, verbose)


def _time_keras_fit(keras) -> None:
    model, base = getattr(keras, "Model", None), getattr(getattr(keras, "callbacks", None), "Callback", None)
    if model is None or base is None or getattr(model.fit, "_sparkml_dist_timed", False):
        return
    fit = model.fit

    class StepTimes(base):
        """The runner's own callback: each training batch a step of the rank's clock."""

        def on_train_batch_begin(self, batch, logs=None):
            CLOCK.begin("hook")

        def on_train_end(self, logs=None):
            CLOCK.end("hook")

    def timed_fit(self, *args, **kwargs):
        if getattr(getattr(self, "distribute_strategy", None), "_should_use_with_coordinator", False):
            # ParameterServerStrategy refuses batch-level callbacks: its steps run on the workers
            return fit(self, *args, **kwargs)
        args = list(args)
        given = args[_CALLBACKS_AT] if len(args) > _CALLBACKS_AT else kwargs.get("callbacks")
        callbacks = list(given or [])
        if not any(isinstance(c, StepTimes) for c in callbacks):
            callbacks.append(StepTimes())
        if len(args) > _CALLBACKS_AT:  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
            args[_CALLBACKS_AT] = callbacks
        else:
            kwargs["callbacks"] = callbacks
        return fit(self, *args, **kwargs)

    timed_fit._sparkml_dist_timed = True
    model.fit = timed_fit
