"""``DistributedOptimizer`` and ``load_model``: gradients averaged over the ranks.  [rank]

A Keras 3 optimizer whose gradients are averaged over the ranks before each update. The optimizer
returned is of a subclass of the one given (``isinstance`` holds, its config and
saved form are the original's: a model saved with it loads anywhere as a plain optimizer).  Its
``apply`` (which ``model.fit``'s train step and ``apply_gradients`` both call) all-reduces the
gradients in fused buckets first; ``backward_passes_per_step=n`` accumulates n local passes and
communicates once, on the n-th.

Example::

    opt = hvd.DistributedOptimizer(keras.optimizers.Adadelta(1.0 * hvd.size()))
    model.compile(optimizer=opt, loss="categorical_crossentropy")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from ..errors import ConfigurationError
from . import _collectives, _ranks
from ._values import Average, reduce_op


@dataclass(frozen=True)
class _Settings:
    op: str
    compression: Any
    predivide: float
    passes: int
    average_passes: bool


class _Averaging:
    """Mixed in before the user's optimizer class: gradients reduced over the ranks in ``apply``."""

    _sparkml_dist: _Settings

    def apply(self, grads, trainable_variables=None):
        s = self._sparkml_dist
        grads = list(grads)
        if s.passes > 1:
            grads = self._accumulate(grads)
            if grads is None:
                return None  # not the n-th pass: nothing applied, nothing sent
        live = [g for g in grads if g is not None]
        if live and _ranks.distributed():
            average = s.op == Average
            _collectives.allreduce_(live, average, s.compression, 1.0 / s.predivide, s.predivide)
        return super().apply(grads, trainable_variables)

    def _accumulate(self, grads: List[Any]) -> Optional[List[Any]]:
        s = self._sparkml_dist
        held = getattr(self, "_sparkml_dist_held", None)
        if held is None:
            held = [None if g is None else g.detach().clone() for g in grads]
        else:
            for h, g in zip(held, grads):
                if h is not None and g is not None:
                    h.add_(g)
        count = getattr(self, "_sparkml_dist_count", 0) + 1
        if count < s.passes:
            self._sparkml_dist_held, self._sparkml_dist_count = held, count
            return None
        self._sparkml_dist_held, self._sparkml_dist_count = None, 0
        if s.average_passes:
            held = [None if h is None else h.div_(s.passes) for h in held]
        return held


def DistributedOptimizer(
    optimizer,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=_collectives.Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: str = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups=None,
    process_set=None,
    scale_local_gradients: bool = True,
):
    """``optimizer`` (a Keras 3 optimizer, not yet used) averaging its gradients over the ranks.

    Horovod's arguments: ``compression`` (``hvd.Compression.fp16`` sends float16), ``op``
    (``hvd.Average`` or ``hvd.Sum``), ``gradient_predivide_factor`` (divide before the sum and
    multiply after), ``backward_passes_per_step`` with ``average_aggregated_gradients``.  Buckets
    are cut by ``HOROVOD_FUSION_THRESHOLD`` bytes, so ``num_groups`` / ``groups`` change nothing in
    the result; ``device_dense``, ``device_sparse`` and ``sparse_as_dense`` are TensorFlow's (torch
    gradients are dense on the model's device) and are accepted as they are.
    """
    op = _check(optimizer, op, gradient_predivide_factor, backward_passes_per_step, process_set)
    base = type(optimizer)
    cls = type(
        base.__name__, (_Averaging, base), {"__module__": base.__module__, "__qualname__": base.__qualname__}
    )
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = cls.from_config(config)
    wrapped._sparkml_dist = _Settings(
        op,
        compression,
        float(gradient_predivide_factor),
        backward_passes_per_step,
        bool(average_aggregated_gradients),
    )
    return wrapped


def _check(optimizer, op, gradient_predivide_factor, backward_passes_per_step, process_set) -> str:
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigurationError(
            f"DistributedOptimizer needs a Keras 3 optimizer (keras.optimizers.*), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}. A tf.keras (Keras 2) optimizer "
            "belongs under backend='tensorflow' with MultiWorkerMirroredStrategy; a torch optimizer "
            "under torch's DistributedDataParallel"
        )
    if isinstance(optimizer, _Averaging):
        raise ConfigurationError("this optimizer is already a DistributedOptimizer: wrap it once")
    op = reduce_op(op, None)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ConfigurationError("gradient_predivide_factor is for op=hvd.Average only")
    if not gradient_predivide_factor > 0:
        raise ConfigurationError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ConfigurationError(
            f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}"
        )
    if process_set is not None:
        raise ConfigurationError("process_set: every rank of the run takes part here; leave it out")
    return op


def load_model(
    filepath, custom_optimizers=None, custom_objects=None, compression=_collectives.Compression.none
):
    """A saved Keras model whose optimizer (with its state) becomes a :func:`DistributedOptimizer`.

    ``custom_optimizers``: optimizer classes the file names beyond Keras's own; ``custom_objects``:
    as ``keras.saving.load_model``'s.
    """
    import keras

    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.saving.load_model(filepath, custom_objects=objects or None)
    old = getattr(model, "optimizer", None)
    if old is None:
        return model
    new = DistributedOptimizer(old, compression=compression)
    if old.built:
        new.build(model.trainable_variables)
        if len(new.variables) != len(old.variables):
            raise ConfigurationError(
                f"{filepath}: its optimizer holds {len(old.variables)} variables, the rebuilt one "
                f"{len(new.variables)}; load it with keras.saving.load_model and wrap the optimizer yourself"
            )
        for mine, theirs in zip(new.variables, old.variables):
            mine.assign(theirs)
    model.optimizer = new
    return model
