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

from .. import serialization
from ..errors import ConfigurationError

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


def check(fn: Callable, backend: str) -> None:
    """Refuse, naming the fix, a function whose frameworks are missing here or do not fit ``backend``."""
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "the function"))
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
