"""Small scikit-learn estimators in a few hundred bytes: the format of many models.  [anywhere]

A fitted estimator whose state is plain values and numeric arrays.  skops stores any
scikit-learn object safely, at about 0.5 ms and 5 KB for a linear model; with one model per key
at 10^5-10^6 keys that is most of the fit and most of the storage.  This format takes an
estimator when

* its class is one scikit-learn lists among its estimators (``sklearn.utils.all_estimators``: the
  list skops trusts by default), exactly that class, not a subclass;
* every attribute (``__dict__``: its parameters and its fitted state) is a JSON value (text,
  numbers, booleans, None, and lists and string-keyed dicts of those), a numpy array of numbers,
  booleans or fixed-width text, a numpy number, or a 1-d object array of text
  (``feature_names_in_`` of a model fitted on a DataFrame, string ``classes_``).

Anything else (a tree, a pipeline, an object array of other things) goes to skops as before.  Layout::

    b"SDSTATE1" | 4 bytes: the header's length | the header (JSON) | the arrays' bytes

with the header ``{"class", "sklearn", "values": {name: JSON value}, "arrays": {name: [dtype,
shape, offset, nbytes]}, "scalars": [names of numpy numbers, stored as 0-d arrays], "texts":
{name: [text, ...]}}``.  Loading runs
no code from the bytes: the class is looked up in that fixed list (a name outside it is refused),
the object is made with ``object.__new__`` and its ``__dict__`` set, and each array is read with
``numpy.frombuffer`` after its dtype (numbers, booleans or fixed-width text; no objects) and its
size against the bytes were checked.  Nothing is called on the object.

Example::

    data = dumps(fitted_linear_regression)     # None when the estimator does not qualify
    model = loads(data)
"""

from __future__ import annotations

import functools
import json
import logging
import struct
from typing import Any, Dict, Optional

import numpy as np

from .checks import UnsafeModelError
from .plain import is_plain

MAGIC = b"SDSTATE1"
_KINDS = "biufc?US"  # numpy dtype kinds an array may have: numbers, fixed-width text; no objects
log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def estimator_classes() -> Dict[str, type]:
    """scikit-learn's estimators by full name (``sklearn.linear_model._base.LinearRegression``)."""
    from sklearn.utils import all_estimators

    return {f"{c.__module__}.{c.__qualname__}": c for _, c in all_estimators()}


def _name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _array_ok(value: Any) -> bool:
    return value.dtype.kind in _KINDS and value.dtype.byteorder != ">"


def _texts(value: Any) -> bool:
    """A 1-d object array of text (``feature_names_in_``, string ``classes_``)."""
    return (
        isinstance(value, np.ndarray)
        and value.dtype.kind == "O"
        and value.ndim == 1
        and all(type(v) is str for v in value)
    )


def qualifies(obj: Any) -> bool:
    """Whether :func:`dumps` takes ``obj`` (see the module docstring)."""
    if not type(obj).__module__.startswith("sklearn.") or _name(obj) not in estimator_classes():
        return False
    state = getattr(obj, "__dict__", None)
    return isinstance(state, dict) and all(
        (isinstance(v, (np.ndarray, np.generic)) and _array_ok(v)) or _texts(v) or is_plain(v, tagged=False)
        for v in state.values()
    )


def dumps(obj: Any) -> bytes:
    """The estimator in this format; a ``TypeError`` when it does not :func:`qualify <qualifies>`."""
    if not qualifies(obj):
        raise TypeError(f"a {_name(obj)} is not an estimator of plain values and numeric arrays")
    values, arrays, scalars, texts, chunks, offset = {}, {}, [], {}, [], 0
    for name, value in obj.__dict__.items():
        if _texts(value):
            texts[name] = value.tolist()
            continue
        if isinstance(value, np.generic):
            scalars.append(name)
            value = np.asarray(value)
        if isinstance(value, np.ndarray):
            raw = np.ascontiguousarray(value).tobytes()
            arrays[name] = [value.dtype.str, list(value.shape), offset, len(raw)]
            chunks.append(raw)
            offset += len(raw)
        else:
            values[name] = value
    import sklearn

    header = {"class": _name(obj), "sklearn": sklearn.__version__, "values": values, "arrays": arrays}
    if scalars:
        header["scalars"] = scalars
    if texts:
        header["texts"] = texts
    text = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(text)), text, *chunks])


def loads(data: bytes, what: str = "model") -> Any:
    """The estimator :func:`dumps` wrote (see the module docstring for what is checked)."""
    data = memoryview(data)
    if bytes(data[: len(MAGIC)]) != MAGIC or len(data) < len(MAGIC) + 4:
        raise UnsafeModelError(f"{what} is not an estimator state (no {MAGIC!r} header)")
    (size,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4 + size
    try:
        header = json.loads(bytes(data[len(MAGIC) + 4 : start]))
    except ValueError:
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("values"), dict):
        raise UnsafeModelError(f"{what}: its estimator state header is not valid")
    cls = estimator_classes().get(header.get("class"))
    if cls is None:
        raise UnsafeModelError(
            f"{what} names class {header.get('class')!r}, which is not a scikit-learn estimator; "
            "refusing to construct it"
        )
    state = dict(header["values"])
    if not all(type(k) is str for k in state):
        raise UnsafeModelError(f"{what}: its estimator state names a non-text attribute")
    body = data[start:]
    for name, spec in (header.get("arrays") or {}).items():
        state[str(name)] = _array(body, spec, f"{what}: array {name!r}")
    for name in header.get("scalars") or ():
        if name not in state or not isinstance(state[name], np.ndarray) or state[name].ndim:
            raise UnsafeModelError(f"{what}: scalar {name!r} is not a 0-d array")
        state[name] = state[name][()]
    for name, items in (header.get("texts") or {}).items():
        if not isinstance(items, list) or not all(type(v) is str for v in items):
            raise UnsafeModelError(f"{what}: text array {name!r} holds something other than text")
        state[str(name)] = np.array(items, dtype=object)
    _warn_version(header.get("sklearn"))
    obj = object.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _array(body: memoryview, spec: Any, what: str) -> np.ndarray:
    try:
        dtype_text, shape, offset, nbytes = spec
        dtype = np.dtype(str(dtype_text))
        shape = tuple(int(s) for s in shape)
        offset, nbytes = int(offset), int(nbytes)
    except (TypeError, ValueError):
        raise UnsafeModelError(f"{what} is described wrongly: {spec!r}") from None
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if (
        dtype.kind not in _KINDS
        or dtype.hasobject
        or min(shape or (0,)) < 0
        or offset < 0
        or nbytes != count * dtype.itemsize
        or offset + nbytes > len(body)
    ):
        raise UnsafeModelError(f"{what} does not fit its bytes or is not numbers: {spec!r}")
    return np.frombuffer(body[offset : offset + nbytes], dtype=dtype).reshape(shape).copy()


@functools.lru_cache(maxsize=8)
def _warn_version(saved: Optional[str]) -> None:
    import sklearn

    if saved != sklearn.__version__:
        log.warning(
            "a model saved with scikit-learn %s is loaded with %s: as with scikit-learn's own "
            "persistence, it may predict differently or fail; fit it again with this version",
            saved,
            sklearn.__version__,
        )
