"""Model files whose loading runs no code.  [anywhere]

``encode(obj) -> (format, bytes)`` picks a format by what ``obj`` is; ``decode(format, bytes)``
reads it back; both go through one table of formats (:data:`FORMATS`: name, file extension, which
objects it takes, how it writes and reads).  The format is recorded next to the bytes (a model
store's manifest), never guessed from them.

===================  ==========================================  ===========================================
format               written for                                 how loading stays inert
===================  ==========================================  ===========================================
``json``             plain values (dicts, lists, numbers,        ``json.loads``; dates and decimals tagged
                     strings, dates, decimals)
``xgboost``          XGBoost scikit-learn models                 XGBoost's own UBJSON model format, parsed
                                                                 by XGBoost; the class comes from a fixed
                                                                 registry, never from the file
``safetensors``      a dict of name -> ``torch.Tensor``          ``safetensors``: raw tensor bytes only
``parquet``          a pyarrow Table (a grouped model's keys,    Parquet: typed columns, no objects
                     its blocks of members)
``estimator_state``  a scikit-learn estimator whose state is     JSON and raw numeric arrays; the class
                     plain values and numeric arrays (a linear   from a reviewed list of classes numpy
                     model: ~0.4 KB, ~100x faster than skops)    alone predicts with (:mod:`.estimator_state`)
``skops``            everything else: scikit-learn estimators    ``skops.io`` (the scikit-learn project's
                     and pipelines, numpy arrays, other plain    safe persistence): only types on an
                     Python objects                              explicit list are constructed, no
                                                                 ``__reduce__`` is ever called; tree node
                                                                 arrays and support vector machines are
                                                                 then validated (:mod:`.checks`)
``pickle``           only when the writer passed                 not loaded unless the reader passes
                     ``allow_pickle=True``                       ``allow_pickle=True``
===================  ==========================================  ===========================================

Trusted types for ``skops``: skops' own defaults (scikit-learn estimators, numpy, scipy), the
scikit-learn internals in :data:`TRUSTED_TYPES` (checked after loading), the package's own classes,
then what the caller adds (``trusted_types=[...]`` or the environment variable
``SPARKML_DIST_TRUSTED_TYPES``, comma separated, fully qualified names such as
``"mypackage.models.MyEstimator"``).  A refused file raises :class:`UnsafeModelError` naming the
types and these opt-ins.

Example::

    fmt, data = encode(fitted_tree)          # ("skops", b"PK...")
    model = decode(fmt, data)                 # no code from the file runs
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from ..errors import CollectionError
from . import estimator_state
from .checks import UnsafeModelError, check_sklearn
from .plain import from_json, is_plain, to_json

TRUSTED_TYPES_ENV = "SPARKML_DIST_TRUSTED_TYPES"

# scikit-learn internals skops does not trust by default because a crafted file could make
# predict() index out of bounds (not run code): check_trees() verifies every node after loading.
TRUSTED_TYPES = (
    "sklearn.tree._tree.Tree",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
)
_OWN_TYPES = (
    "sparkml_dist.ensemble.member_records.Member",
    "sparkml_dist.ensemble.member_records.KeyModel",
    "sparkml_dist.ensemble.aggregation.Member",  # where files of earlier releases name them
    "sparkml_dist.ensemble._grouped_worker.KeyModel",
)
_XGBOOST_CLASSES = ("XGBClassifier", "XGBRegressor", "XGBRFClassifier", "XGBRFRegressor", "XGBRanker")


# --------------------------------------------------------------------------- encode
def _xgboost_class(obj: Any) -> Optional[str]:
    cls = type(obj)
    if cls.__module__.split(".")[0] == "xgboost" and cls.__name__ in _XGBOOST_CLASSES:
        return cls.__name__
    return None


def _is_tensor_dict(obj: Any) -> bool:
    if not isinstance(obj, dict) or not obj or type(next(iter(obj.values()))).__module__ != "torch":
        return False
    import torch

    return all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _skops_bytes(obj: Any) -> bytes:
    import skops.io as sio

    data = sio.dumps(obj)
    unnamed = [t for t in sio.get_untrusted_types(data=data) if "<lambda>" in t or "<locals>" in t]
    if unnamed:  # skops refers to functions and classes by name: these have none to load by
        raise TypeError(f"{unnamed} cannot be found by name when loading")
    return data


def _is_arrow_table(obj: Any) -> bool:
    return type(obj).__module__.startswith("pyarrow") and type(obj).__name__ == "Table"


def _parquet_bytes(table: Any) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _parquet_load(data: bytes, opts: dict) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise UnsafeModelError(f"{opts['what']} is not a valid Parquet table: {exc}") from None


def _safetensors_bytes(obj: dict) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous().clone() for k, v in obj.items()})


def _safetensors_load(data: bytes, opts: dict) -> Any:
    from safetensors.torch import load

    return load(data)


def _pickle_load(data: bytes, opts: dict) -> Any:
    if not opts["allow_pickle"]:
        old = (
            " (written before sparkml_dist recorded formats: an older release)" if opts["fmt"] is None else ""
        )
        raise UnsafeModelError(
            f"{opts['what']} is a pickle{old}; loading a pickle runs whatever code it names. It was "
            "refused. If you trust where it comes from, load it with allow_pickle=True "
            "(e.g. Model.read().allow_pickle().load(path)), then save it again to convert it "
            "to formats that load without running code."
        )
    from .. import serialization

    return serialization.loads(data)


@dataclass(frozen=True)
class Format:
    """One model format: its ``name`` (recorded beside the bytes), the file ``extension`` a store
    gives it, which objects :func:`encode` writes in it (``takes``, tried in table order), how
    (``write``), and how :func:`decode` reads it back with its checks (``read(data, opts)``)."""

    name: str
    extension: str
    takes: Callable[[Any], bool]
    write: Callable[[Any], bytes]
    read: Callable[[bytes, dict], Any]


def _pickle_bytes(obj: Any) -> bytes:
    from .. import serialization

    return serialization.dumps(obj)


# The one table of formats: encode tries them in this order (pickle only with allow_pickle=True).
FORMATS: Tuple[Format, ...] = (
    Format("json", "json", is_plain, to_json, lambda data, opts: from_json(data)),
    Format(
        "parquet", "parquet", _is_arrow_table, _parquet_bytes, lambda data, opts: _parquet_load(data, opts)
    ),
    Format(
        "xgboost",
        "ubj",
        lambda obj: _xgboost_class(obj) is not None,
        lambda obj: _xgboost_bytes(obj, _xgboost_class(obj)),
        lambda data, opts: _xgboost_load(data, opts["what"], opts["signed"]),
    ),
    Format("safetensors", "safetensors", _is_tensor_dict, _safetensors_bytes, _safetensors_load),
    Format(
        "estimator_state",
        "sdstate",
        estimator_state.qualifies,
        estimator_state.dumps,
        lambda data, opts: estimator_state.loads(data, opts["what"]),
    ),
    Format(
        "skops",
        "skops",
        lambda obj: True,
        _skops_bytes,
        lambda data, opts: _skops_load(data, opts["trusted_types"], opts["what"]),
    ),
    Format("pickle", "pkl", lambda obj: False, _pickle_bytes, _pickle_load),
)
BY_NAME: Dict[str, Format] = {f.name: f for f in FORMATS}


def encode(obj: Any, *, allow_pickle: bool = False) -> Tuple[str, bytes]:
    """``(format, bytes)`` for ``obj``: the first format of :data:`FORMATS` that takes it."""
    fmt = next(f for f in FORMATS if f.takes(obj))
    try:
        return fmt.name, fmt.write(obj)
    except Exception as exc:  # noqa: BLE001 - what the format cannot represent
        if fmt.name == "xgboost":
            raise CollectionError(f"cannot save this {_xgboost_class(obj)}: {exc}") from None
        if fmt.name != "skops":
            raise
        if allow_pickle:  # what skops cannot represent: only pickle can carry it
            return "pickle", _pickle_bytes(obj)
        raise CollectionError(
            f"a {type(obj).__module__}.{type(obj).__qualname__} cannot be saved in a format whose "
            f"loading runs no code (skops: {type(exc).__name__}: {exc}). Keep models to scikit-learn-API "
            "estimators of importable classes, or save with allow_pickle=True (and load it the same "
            "way, only from where you trust)"
        ) from None


def _xgboost_bytes(model: Any, name: str) -> bytes:
    """A JSON header line (class, and the parameters of an unfitted model), then the UBJSON model."""
    import tempfile

    if not model.__sklearn_is_fitted__():  # e.g. the estimator a bagging ensemble clones
        params = model.get_params()
        if not is_plain(params):
            raise TypeError(f"the parameters of this unfitted {name} are not plain values")
        return to_json({"class": name, "params": params}) + b"\n"
    with tempfile.TemporaryDirectory(prefix="sparkml_dist-xgb-") as d:
        path = os.path.join(d, "model.ubj")
        model.save_model(path)
        with open(path, "rb") as fh:
            return to_json({"class": name}) + b"\n" + fh.read()


# --------------------------------------------------------------------------- decode
def trusted_types(extra: Iterable[str] = ()) -> list:
    """The types ``skops`` may construct: the package's list, the environment's, then ``extra``."""
    env = [t.strip() for t in os.environ.get(TRUSTED_TYPES_ENV, "").split(",") if t.strip()]
    return list(dict.fromkeys([*TRUSTED_TYPES, *_OWN_TYPES, *env, *extra]))


def decode(
    fmt: Optional[str],
    data: bytes,
    *,
    trusted_types: Iterable[str] = (),
    allow_pickle: bool = False,
    what: str = "model file",
    signed: bool = False,
) -> Any:
    """Read bytes written by :func:`encode` in format ``fmt``; refuses what would run code, and any
    tree structure that would corrupt memory when used (:mod:`sparkml_dist.formats.checks`,
    :mod:`sparkml_dist.formats.xgboost_checks`).  ``signed``: the bytes come from a store whose signature
    verified; structures that cannot be validated are then accepted.

    ``fmt`` None means a file written before formats were recorded (sparkml_dist 0.1): a pickle.
    """
    found = BY_NAME.get(fmt if fmt is not None else "pickle")
    if found is None:
        raise UnsafeModelError(f"{what} has an unknown format {fmt!r}; refusing to load it")
    opts = dict(fmt=fmt, what=what, signed=signed, trusted_types=trusted_types, allow_pickle=allow_pickle)
    return found.read(data, opts)


def _xgboost_load(data: bytes, what: str, signed: bool = False) -> Any:
    import tempfile

    from .xgboost_checks import check_xgboost

    header_line, _, body = bytes(data).partition(b"\n")
    try:
        header = from_json(header_line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("params", {}), dict):
        raise UnsafeModelError(f"{what} has no valid XGBoost header line")
    name = header.get("class")
    if name not in _XGBOOST_CLASSES:
        raise UnsafeModelError(f"{what} names XGBoost class {name!r}, not one of {_XGBOOST_CLASSES}")
    import xgboost

    model = getattr(xgboost, name)(**header.get("params", {}))
    if not body:
        return model
    check_xgboost(body, what, signed)
    with tempfile.TemporaryDirectory(prefix="sparkml_dist-xgb-") as d:
        path = os.path.join(d, "model.json" if body[:2] == b'{"' else "model.ubj")
        with open(path, "wb") as fh:
            fh.write(body)
        model.load_model(path)
    return model


def _skops_load(data: bytes, trusted: Iterable[str], what: str) -> Any:
    import skops.io as sio

    allowed = trusted_types(trusted)
    untrusted = [t for t in sio.get_untrusted_types(data=data) if t not in allowed]
    if untrusted:
        raise UnsafeModelError(
            f"{what} holds types that are not trusted: {untrusted}. Nothing was loaded. If you "
            f"reviewed them and trust the file, pass trusted_types={untrusted!r} (or set "
            f"{TRUSTED_TYPES_ENV}); allow_pickle=True is not needed for these."
        )
    obj = sio.loads(data, trusted=allowed)
    check_sklearn(obj, what)
    return obj
