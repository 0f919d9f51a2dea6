"""Model files whose loading runs no code.  [anywhere]

``encode(obj) -> (format, bytes)`` picks a format by what ``obj`` is; ``decode(format, bytes)``
reads it back.  The format is recorded next to the bytes (a model store's manifest), never guessed
from them.

=============  ==========================================  ===========================================
format         written for                                 how loading stays inert
=============  ==========================================  ===========================================
``json``       plain values (dicts, lists, numbers,         ``json.loads``; dates and decimals tagged
               strings, dates, decimals)
``xgboost``    XGBoost scikit-learn models                  XGBoost's own UBJSON model format, parsed
                                                            by XGBoost; the class comes from a fixed
                                                            registry, never from the file
``safetensors`` a dict of name -> ``torch.Tensor``          ``safetensors``: raw tensor bytes only
``skops``      everything else: scikit-learn estimators     ``skops.io`` (the scikit-learn project's
               and pipelines, numpy arrays, other plain     safe persistence): only types on an explicit
               Python objects                               list are constructed, no ``__reduce__`` is
                                                            ever called; tree node arrays are then
                                                            validated (:mod:`.model_checks`)
``pickle``     only when the writer passed                  not loaded unless the reader passes
               ``allow_pickle=True``                        ``allow_pickle=True``
=============  ==========================================  ===========================================

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

import datetime
import decimal
import json
import os
from typing import Any, Iterable, Optional, Tuple

from .errors import CollectionError
from .model_checks import UnsafeModelError, check_sklearn

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


# --------------------------------------------------------------------------- json
_SCALARS = (str, int, float, bool, type(None), datetime.date, decimal.Decimal)


def is_plain(value: Any) -> bool:
    """JSON round-trips ``value`` exactly: dicts with string keys, lists, strings, numbers,
    booleans, None, dates and decimals (not tuples, not numpy values)."""
    if type(value) in _SCALARS or isinstance(value, datetime.date):
        return True  # Python's json writes and reads NaN and Infinity too
    if type(value) is list:
        return all(is_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    return False


def _tag(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"__date__": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"__decimal__": str(value)}
    raise TypeError(f"{type(value).__name__} is not a plain value")


def _untag(obj: dict) -> Any:
    if len(obj) == 1:
        ((key, text),) = obj.items()
        if key == "__datetime__":
            return datetime.datetime.fromisoformat(text)
        if key == "__date__":
            return datetime.date.fromisoformat(text)
        if key == "__decimal__":
            return decimal.Decimal(text)
    return obj


def to_json(value: Any) -> bytes:
    return json.dumps(value, default=_tag, sort_keys=True).encode()


def from_json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"), object_hook=_untag)


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


def encode(obj: Any, *, allow_pickle: bool = False) -> Tuple[str, bytes]:
    """``(format, bytes)`` for ``obj`` (see the module docstring for the choice)."""
    if is_plain(obj):
        return "json", to_json(obj)
    name = _xgboost_class(obj)
    if name is not None:
        try:
            return "xgboost", _xgboost_bytes(obj, name)
        except TypeError as exc:
            raise CollectionError(f"cannot save this {name}: {exc}") from None
    if _is_tensor_dict(obj):
        from safetensors.torch import save

        return "safetensors", save({k: v.detach().cpu().contiguous().clone() for k, v in obj.items()})
    try:
        import skops.io as sio

        data = sio.dumps(obj)
        unnamed = [t for t in sio.get_untrusted_types(data=data) if "<lambda>" in t or "<locals>" in t]
        if unnamed:  # skops refers to functions and classes by name: these have none to load by
            raise TypeError(f"{unnamed} cannot be found by name when loading")
        return "skops", data
    except Exception as exc:  # what skops cannot represent: only pickle can carry it
        if allow_pickle:
            from . import serialization

            return "pickle", serialization.dumps(obj)
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
    tree structure that would corrupt memory when used (:mod:`sparkml_dist.model_checks`,
    :mod:`sparkml_dist.xgboost_checks`).  ``signed``: the bytes come from a store whose signature
    verified; structures that cannot be validated are then accepted.

    ``fmt`` None means a file written before formats were recorded (sparkml_dist 0.1): a pickle.
    """
    if fmt == "json":
        return from_json(data)
    if fmt == "xgboost":
        return _xgboost_load(data, what, signed)
    if fmt == "safetensors":
        from safetensors.torch import load

        return load(data)
    if fmt == "skops":
        return _skops_load(data, trusted_types, what)
    if fmt in ("pickle", None):
        if not allow_pickle:
            old = " (written before sparkml_dist recorded formats: an older release)" if fmt is None else ""
            raise UnsafeModelError(
                f"{what} is a pickle{old}; loading a pickle runs whatever code it names. It was "
                "refused. If you trust where it comes from, load it with allow_pickle=True "
                "(e.g. Model.read().allow_pickle().load(path)), then save it again to convert it "
                "to formats that load without running code."
            )
        from . import serialization

        return serialization.loads(data)
    raise UnsafeModelError(f"{what} has an unknown format {fmt!r}; refusing to load it")


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
