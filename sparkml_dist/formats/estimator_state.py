"""Small scikit-learn estimators in a few hundred bytes: the format of many models.  [anywhere]

A fitted estimator whose state is plain values and numeric arrays.  skops stores any
scikit-learn object safely, at about 0.5 ms and 5 KB for a linear model; with one model per key
at 10^5-10^6 keys that is most of the fit and most of the storage.  This format takes an
estimator when

* its class is one of :data:`CLASSES`, exactly that class, not a subclass: scikit-learn
  estimators reviewed for this format, each predicting or transforming with numpy alone on its
  arrays (linear models, naive Bayes, linear discriminant analysis, scalers, PCA, dummies), so
  that arrays of the wrong shape make numpy raise, never a compiled loop read out of bounds;
* every attribute (``__dict__``: its parameters and its fitted state) is a JSON value (text,
  numbers, booleans, None, and lists and string-keyed dicts of those), a numpy array of numbers,
  booleans or fixed-width text, a numpy number, or a 1-d object array of text
  (``feature_names_in_`` of a model fitted on a DataFrame, string ``classes_``).

Anything else (a tree, a support vector machine, a pipeline, an object array of other things)
goes to skops as before.  Layout::

    b"SDSTATE1" | 4 bytes: the header's length | the header (JSON) | the arrays' bytes

with the header ``{"class", "sklearn", "values": {name: JSON value}, "arrays": {name: [dtype,
shape, offset, nbytes(, "F": a Fortran-ordered array's bytes)]}, "scalars": [names of numpy
numbers, stored as 0-d arrays], "texts": {name: [text, ...]}}``. Loading runs no code from the
bytes: the class is looked up in :data:`CLASSES` (a name outside it is refused, whatever else
scikit-learn offers), the object is made with ``object.__new__`` and its ``__dict__`` set, and each
array is read with ``numpy.frombuffer`` after its dtype (numbers, booleans or fixed-width text; no
objects), its element count (exact integers: a shape whose product would wrap int64 is refused) and
its size against the bytes were checked; the object then passes the same structural checks as a
skops file (:func:`~sparkml_dist.formats.checks.check_sklearn`). Nothing is called on the object.

Example::

    data = dumps(fitted_linear_regression)     # None when the estimator does not qualify
    model = loads(data)
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import struct
from typing import Any, Dict, Optional

import numpy as np

from .checks import UnsafeModelError, check_sklearn
from .plain import is_plain

MAGIC = b"SDSTATE1"
_KINDS = "biufc?US"  # numpy dtype kinds an array may have: numbers, fixed-width text; no objects
_MAX_ELEMENTS = 1 << 40  # more elements than any model here holds; past it a count is a forgery
log = logging.getLogger(__name__)

# The classes this format writes and reads (reviewed: numpy alone predicts or transforms with
# their arrays; a fitted one holds plain values only: others, say SGDClassifier's loss object or
# MinMaxScaler's tuple, go to skops).  Public names: where scikit-learn keeps each class is looked up at load.
CLASSES = (
    "sklearn.linear_model.LinearRegression", "sklearn.linear_model.Ridge", "sklearn.linear_model.Lasso",
    "sklearn.linear_model.LassoCV", "sklearn.linear_model.ElasticNet", "sklearn.linear_model.ElasticNetCV",
    "sklearn.linear_model.LassoLars", "sklearn.linear_model.LassoLarsIC",
    "sklearn.linear_model.OrthogonalMatchingPursuit", "sklearn.linear_model.BayesianRidge",
    "sklearn.linear_model.ARDRegression", "sklearn.linear_model.HuberRegressor",
    "sklearn.linear_model.QuantileRegressor", "sklearn.linear_model.TheilSenRegressor",
    "sklearn.linear_model.LogisticRegression", "sklearn.linear_model.SGDRegressor",
    "sklearn.linear_model.PassiveAggressiveRegressor", "sklearn.svm.LinearSVC", "sklearn.svm.LinearSVR",
    "sklearn.naive_bayes.GaussianNB", "sklearn.naive_bayes.MultinomialNB",
    "sklearn.naive_bayes.BernoulliNB", "sklearn.naive_bayes.ComplementNB",
    "sklearn.discriminant_analysis.LinearDiscriminantAnalysis", "sklearn.dummy.DummyClassifier",
    "sklearn.dummy.DummyRegressor", "sklearn.preprocessing.StandardScaler",
    "sklearn.preprocessing.MaxAbsScaler", "sklearn.preprocessing.Normalizer",
    "sklearn.preprocessing.Binarizer", "sklearn.decomposition.PCA",
    "sklearn.decomposition.IncrementalPCA", "sklearn.decomposition.TruncatedSVD",
    "sklearn.feature_selection.VarianceThreshold",
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def estimator_classes() -> Dict[str, type]:
    """The classes of :data:`CLASSES` by full name (``sklearn.linear_model._base.LinearRegression``,
    as objects name their class); one a scikit-learn release lacks is left out."""
    out = {}
    for public in CLASSES:
        module, _, name = public.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        if isinstance(cls, type):
            out[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return out


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
            fortran = value.ndim > 1 and value.flags.f_contiguous and not value.flags.c_contiguous
            raw = value.tobytes(order="F" if fortran else "C")  # its layout kept: BLAS sums the same
            arrays[name] = [value.dtype.str, list(value.shape), offset, len(raw)] + (["F"] if fortran else [])
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
            f"{what} names class {header.get('class')!r}, which this format never writes (it holds "
            "only the reviewed classes of sparkml_dist.formats.estimator_state.CLASSES); refusing to "
            "construct it"
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
    check_sklearn(obj, what)  # the structures a compiled predictor would walk, as for skops
    return obj


def _array(body: memoryview, spec: Any, what: str) -> np.ndarray:
    try:
        dtype_text, shape, offset, nbytes, *order = spec
        if order not in ([], ["F"]):
            raise ValueError(order)
        dtype = np.dtype(str(dtype_text))
        shape = tuple(int(s) for s in shape)
        offset, nbytes = int(offset), int(nbytes)
    except (TypeError, ValueError):
        raise UnsafeModelError(f"{what} is described wrongly: {spec!r}") from None
    count = math.prod(shape)  # exact: a product that would wrap int64 stays huge and is refused
    if any(s > _MAX_ELEMENTS for s in shape) or count > _MAX_ELEMENTS:
        raise UnsafeModelError(f"{what} claims {count} elements: more than any model holds ({spec!r})")
    if (
        dtype.kind not in _KINDS
        or dtype.hasobject
        or min(shape or (0,)) < 0
        or offset < 0
        or nbytes != count * dtype.itemsize
        or offset + nbytes > len(body)
    ):
        raise UnsafeModelError(f"{what} does not fit its bytes or is not numbers: {spec!r}")
    flat = np.frombuffer(body[offset : offset + nbytes], dtype=dtype)
    return flat.reshape(shape, order="F" if order else "C").copy(order="K")


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
