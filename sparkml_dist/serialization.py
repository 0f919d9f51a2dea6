"""Object <-> bytes for models and results.  [anywhere]

``dumps`` uses cloudpickle, so lambdas and classes defined in a notebook survive the trip to
executors and back.  Bytes that come back through Spark (``collect``) were produced by our own
executor code under Spark's authentication, and are loaded with :func:`loads`.

:func:`unpicklable_part` names what a function captures that cannot travel (for the errors of
every feature that ships a user's function); :func:`imported_modules` what it imports, read from
its code without running it (which framework a training function needs).

Bytes read from *files* (a model store, a saved model) may have been planted by someone else, and
unpickling is code execution: they are never read here, but with :mod:`sparkml_dist.formats`
(skops, XGBoost's own format, safetensors, JSON), which run no code.
"""

from __future__ import annotations

import copyreg
import hashlib
import io
import pickle
import sys
import threading
import types
from collections import ChainMap, OrderedDict
from typing import Any, Callable, Optional, Set

try:  # pyspark vendors cloudpickle; prefer a standalone install when present
    import cloudpickle as _cloudpickle  # type: ignore
except ImportError:  # pragma: no cover - depends on the environment
    from pyspark import cloudpickle as _cloudpickle  # type: ignore


def with_filename(code_reduce: tuple, filename: str):
    """A code object cloudpickle rebuilt, given back the file it was written in (executor side)."""
    code = code_reduce[0](*code_reduce[1])
    return code.replace(co_filename=filename)


def _code_reduce(code):
    """cloudpickle's reduction of a code object, keeping its file name (cloudpickle writes
    ``<dynamic-code>``): a traceback from a function shipped by value names the user's file."""
    return with_filename, (_cloudpickle.cloudpickle._code_reduce(code), code.co_filename)


class _Pickler(_cloudpickle.Pickler):
    _dispatch_table = {**_cloudpickle.Pickler._dispatch_table, types.CodeType: _code_reduce}
    dispatch_table = ChainMap(_dispatch_table, copyreg.dispatch_table)


def dumps(obj: Any) -> bytes:
    """Serialize ``obj`` (including lambdas and notebook-defined classes) to bytes; functions
    shipped by value keep their file name, for the tracebacks of the code that runs them."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def travelling(obj: Any, what: str, fn: Any = None) -> bytes:
    """``obj`` as the bytes the executors load, or a ConfigurationError saying that ``what``
    cannot be sent there, why, and which captured object (of ``fn``, the user's function inside
    ``obj``) is the cause: the one check every feature that ships user code makes."""
    try:
        return dumps(obj)
    except Exception as exc:  # noqa: BLE001 - whatever a captured object raises while pickled
        from .errors import ConfigurationError

        culprit = unpicklable_part(fn) if callable(fn) else ""
        raise ConfigurationError(
            f"cannot send {what} to the executors: {type(exc).__name__}: {exc}.{culprit} Define the "
            "function at module level (or in an importable module) and keep locks, sessions and "
            "open files out of what it captures"
        ) from None


def unpicklable_part(fn: Callable) -> str:
    """Name what a function captures that cannot be pickled (closure cells, then globals)."""
    code = getattr(fn, "__code__", None)
    candidates = []
    if code is not None and getattr(fn, "__closure__", None):
        candidates += list(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__)))
    if code is not None:
        g = getattr(fn, "__globals__", {})
        candidates += [(n, g[n]) for n in code.co_names if n in g and not isinstance(g[n], type(sys))]
    for name, value in candidates:
        try:
            dumps(value)
        except Exception as exc:  # the first capture that cannot travel
            return (
                f" It captures {name!r} ({type(value).__module__}.{type(value).__qualname__}), "
                f"which cannot be pickled: {exc}. Create it inside the function instead."
            )
    return ""


def imported_modules(fn: Callable, depth: int = 3) -> Set[str]:
    """The modules ``fn`` imports in its body (``import a.b``, ``from a import b``: "a.b"), or uses
    from its module's globals; also those of the functions of its own module it calls, ``depth``
    calls deep. Read from the code objects: nothing is run or imported.
    """
    import dis

    found: Set[str] = set()
    seen: Set[int] = set()

    def code_of(fn: Any):
        return getattr(getattr(fn, "__func__", fn), "__code__", None)

    def walk(code, env: dict, left: int) -> None:
        if code is None or id(code) in seen:
            return
        seen.add(id(code))
        module, last_const, from_import = None, None, False
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_CONST":
                last_const = ins.argval
            elif ins.opname == "IMPORT_NAME":
                module, from_import = str(ins.argval), last_const is not None  # the fromlist
                found.add(module)
            elif ins.opname == "IMPORT_FROM" and from_import:
                found.add(f"{module}.{ins.argval}")
            elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in env:
                value = env[ins.argval]
                if isinstance(value, types.ModuleType):
                    found.add(value.__name__)
                elif (
                    left
                    and code_of(value) is not None
                    and getattr(value, "__module__", 0) == env.get("__name__")
                ):
                    walk(code_of(value), getattr(value, "__globals__", env), left - 1)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const, env, left)

    walk(code_of(fn), getattr(fn, "__globals__", {}), depth)
    return found


def ship_by_value(module) -> None:
    """Pickle ``module``'s functions and classes by value from now on: executors that cannot import
    it (a file beside a job, not an installed package) get them with the job."""
    _cloudpickle.register_pickle_by_value(module)


def loads(data: bytes) -> Any:
    """Load bytes produced by :func:`dumps` in this run (trusted channel only)."""
    return pickle.loads(data)


def load_stream(stream) -> Any:
    """:func:`loads` from a binary file object (what :mod:`sparkml_dist.collection` decodes chunks
    with, without joining them first)."""
    return pickle.load(stream)


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
