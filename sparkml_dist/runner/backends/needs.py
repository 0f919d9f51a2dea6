"""The frameworks a training function needs, checked on the driver before any rank starts.  [driver]

Read from the function's code (:func:`sparkml_dist.serialization.imported_modules`, nothing is
run): a framework it imports that this Python lacks is named with the extra that installs it,
and a function written for another backend than the run's is refused with the fix, instead of a
rank's traceback minutes later (or, for a ``MultiWorkerMirroredStrategy`` under torch, every rank
training alone).

Example::

    check(train, "tensorflow")   # ConfigurationError if train imports sparkml_dist.keras
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Callable, Dict, Set, Tuple

from ... import serialization
from ...errors import ConfigurationError

# module a function imports -> (the modules it needs, the extra that installs them)
NEEDS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "sparkml_dist.keras": (("keras", "torch"), "keras"),
    "keras": (("keras",), "keras"),
    "tensorflow": (("tensorflow",), "tensorflow"),
    "tf_keras": (("tf_keras",), "tensorflow"),
    "jax": (("jax",), "jax"),
    "torch": (("torch",), "torch"),
    "horovod": (("horovod",), "horovod"),
}
KERAS_MODULE = "sparkml_dist.keras"


def used(fn: Callable) -> Set[str]:
    """The framework names of :data:`NEEDS` that ``fn`` imports."""
    out = set()
    for module in serialization.imported_modules(fn):
        for name in NEEDS:
            if module == name or module.startswith(name + "."):
                out.add(name)
    return out


def uses_keras_module(fn: Callable) -> bool:
    return KERAS_MODULE in used(fn)


# Horovod's TensorFlow bindings (Horovod 0.28 cannot build against TensorFlow >= 2.16)
HOROVOD_TF = ("horovod.keras", "horovod.tensorflow.keras", "horovod.tensorflow", "horovod._keras")


def _horovod_tf_built() -> bool:
    """Was this Python's Horovod built with TensorFlow (its compiled op library is there)?"""
    import glob
    import os

    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return False
    where = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
    return any(glob.glob(os.path.join(d, "tensorflow", "mpi_lib*.so")) for d in where)


def _refuse_horovod_tf(name: str, modules: Set[str]) -> None:
    """Horovod cannot build against TensorFlow >= 2.16: a program importing its TensorFlow bindings
    is refused with the change that runs it, unless this Horovod has them."""
    bindings = [m for m in HOROVOD_TF if any(i == m or i.startswith(m + ".") for i in modules)]
    if not bindings or _horovod_tf_built():
        return
    binding = max(bindings, key=len)
    keras_fix = (
        "a Keras program runs on Keras 3 with `import sparkml_dist.keras as hvd` in its place "
        "(Horovod's Keras API; HorovodRunner and BarrierRunner run it on backend='torch')"
    )
    tf_fix = (
        "a TensorFlow program runs under tf.distribute.MultiWorkerMirroredStrategy on "
        "BarrierRunner(..., backend='tensorflow') (or MirroredStrategyRunner)"
    )
    fix = keras_fix + "; " + tf_fix if "keras" in binding else tf_fix + "; " + keras_fix
    raise ConfigurationError(
        f"{name} imports {binding}: Horovod's TensorFlow bindings, which this Python's Horovod does "
        f"not have (Horovod 0.28 cannot build against TensorFlow >= 2.16, so reinstalling it with "
        f"HOROVOD_WITH_TENSORFLOW=1 does not help). Instead: {fix}"
    )


def check(fn: Callable, backend: str) -> None:
    """Refuse, naming the fix, a function whose frameworks are missing here or do not fit ``backend``."""
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "the function"))
    _refuse_horovod_tf(name, serialization.imported_modules(fn))
    frameworks = used(fn)
    if KERAS_MODULE in frameworks and backend not in ("torch",):
        raise ConfigurationError(
            f"{name} imports sparkml_dist.keras, which averages gradients through torch.distributed: "
            f"run it with backend='torch' (the default), not backend={backend!r}. A tf.keras program "
            "runs under backend='tensorflow' with MultiWorkerMirroredStrategy, a Keras 3 program on "
            "JAX under backend='jax' with keras.distribution.DataParallel"
        )
    for framework in sorted(frameworks):
        modules, extra = NEEDS[framework]
        missing = [m for m in modules if _absent(m)]
        if missing:
            raise ConfigurationError(
                f"{name} imports {framework}, which needs {' and '.join(missing)}, not installed in "
                f"this Python ({sys.executable}): pip install 'sparkml_dist[{extra}]' on the driver "
                "and the executors"
            )


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent that is not a package, a broken __spec__
        return True
