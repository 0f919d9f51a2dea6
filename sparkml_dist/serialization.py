"""Object <-> bytes for models and results.  [runs anywhere]

``dumps`` uses cloudpickle, so lambdas and classes defined in a notebook survive the trip to
executors and back.  Bytes that come back through Spark (``collect``) were produced by our own
executor code under Spark's authentication, and are loaded with :func:`loads`.

Bytes read from *files* (a model store, a saved model) may have been planted by someone else, and
unpickling is code execution.  :func:`safe_loads` refuses any global outside an allowlist of
modules that hold model classes (scikit-learn, numpy, scipy, xgboost, lightgbm, ...) and refuses
known code-running entry points even inside those modules.  It is defence in depth, not a sandbox:
only load model directories you trust.  Extend the allowlist with ``trusted_modules`` (or the
environment variable ``SPARKML_DIST_TRUSTED_MODULES``, comma separated) for your own model classes.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable, Optional

from .errors import CollectionError

try:  # pyspark vendors cloudpickle; prefer a standalone install when present
    import cloudpickle as _cloudpickle  # type: ignore
except ImportError:  # pragma: no cover - depends on the environment
    from pyspark import cloudpickle as _cloudpickle  # type: ignore

DEFAULT_TRUSTED_MODULES = (
    "sklearn",
    "numpy",
    "scipy",
    "xgboost",
    "lightgbm",
    "catboost",
    "pandas",
    "pyarrow",
    "sparkml_dist",
    "collections",
    "copyreg",
    "_codecs",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "joblib",
    "threadpoolctl",
    "torch",
    "__main__",
)
_SAFE_BUILTINS = frozenset(
    {
        "set",
        "frozenset",
        "dict",
        "list",
        "tuple",
        "slice",
        "complex",
        "bytearray",
        "bytes",
        "range",
        "object",
        "int",
        "float",
        "bool",
        "str",
        "type",
        "NotImplemented",
        "Ellipsis",
    }
)
# names that run code or touch the file system, refused whatever their module
_FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "system",
        "popen",
        "spawn",
        "execv",
        "execve",
        "run",
        "call",
        "check_call",
        "check_output",
        "Popen",
        "runstring",
        "load",
        "loads",
        "open",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "import_module",
        "apply",
        "partial",
        "reduce",
        "remove",
        "rmtree",
        "unlink",
        "save",
        "savez",
        "fromfile",
        "memmap",
        "tofile",
        "loadtxt",
        "genfromtxt",
    }
)
_FORBIDDEN_MODULE_PARTS = ("testing", "distutils", "f2py", "os", "subprocess", "sys", "ctypes")


def dumps(obj: Any) -> bytes:
    """Serialize ``obj`` (including lambdas and notebook-defined classes) to bytes."""
    return _cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    """Load bytes produced by :func:`dumps` in this run (trusted channel only)."""
    return pickle.loads(data)


def digest(data: bytes) -> str:
    """The key :func:`cached_loads` files ``data`` under (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()


_CACHE: "OrderedDict[str, Any]" = OrderedDict()
_CACHE_LOCK = threading.Lock()
CACHE_ENTRIES = 4


def cached_loads(data: bytes, key: Optional[str] = None, then: Optional[Callable[[Any], Any]] = None) -> Any:
    """:func:`loads` once per process for the same bytes: what executors use for what every batch
    or unit of a job needs (members of an ensemble, a search's data).  ``then`` is applied once to
    the loaded object; ``key`` (default :func:`digest` of ``data``) names the entry.  The last
    :data:`CACHE_ENTRIES` entries are kept."""
    key = key or digest(data)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    value = loads(data)
    value = then(value) if then is not None else value
    with _CACHE_LOCK:
        _CACHE[key] = value
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return value


class _AllowlistUnpickler(pickle.Unpickler):
    def __init__(self, file, trusted: tuple[str, ...]):
        super().__init__(file)
        self._trusted = trusted

    def find_class(self, module: str, name: str):
        top = module.split(".")[0]
        parts = module.split(".")
        if module == "builtins":
            ok = name in _SAFE_BUILTINS
        else:
            ok = (
                top in self._trusted
                and name not in _FORBIDDEN_NAMES
                and not any(p in _FORBIDDEN_MODULE_PARTS for p in parts[1:])
            )
        if not ok:
            raise CollectionError(
                f"refusing to load global {module}.{name!r} from a model file: it is not on the "
                "allowlist of model modules, and unpickling it could run code. If you trust this "
                "file, pass trusted_modules=(" + repr(top) + ",) or set SPARKML_DIST_TRUSTED_MODULES."
            )
        return super().find_class(module, name)


def trusted_modules(extra: Iterable[str] = ()) -> tuple[str, ...]:
    env = tuple(m.strip() for m in os.environ.get("SPARKML_DIST_TRUSTED_MODULES", "").split(",") if m.strip())
    return DEFAULT_TRUSTED_MODULES + env + tuple(extra)


def safe_loads(data: bytes, extra_trusted: Iterable[str] = ()) -> Any:
    """Load pickled bytes from an untrusted place (a file), refusing globals off the allowlist."""
    return _AllowlistUnpickler(io.BytesIO(data), trusted_modules(extra_trusted)).load()
