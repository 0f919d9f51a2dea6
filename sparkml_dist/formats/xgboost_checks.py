"""XGBoost model files checked before XGBoost reads them.  [anywhere]

XGBoost's C++ predictor follows a tree's child and split indices without bounds checks: a file
whose indices point outside the tree, outside the input, or form a cycle makes ``predict`` read
out of bounds or never end.  :func:`check_xgboost` parses the model (XGBoost's UBJSON, or JSON)
with a bounded reader of its own and refuses, naming the tree and the fault, anything but

* a ``gbtree`` / ``dart`` booster whose ``num_trees``, ``tree_info`` (each an output group below
  the model's number of outputs), ``iteration_indptr`` and ``weight_drop`` agree with its trees;
* trees with one value per node in every per-node array, children in range forming one tree
  (every node but the root has exactly one parent, which ``parents`` names), split features below
  the model's ``num_feature``, and categorical splits whose segments lie inside ``categories``;
* a ``gblinear`` booster whose weights are ``(num_feature + 1) x outputs``.

Multi-output trees (``size_leaf_vector > 1``) and models with a categorical re-coder are not
validated here: they are refused unless the store is signed (see :mod:`sparkml_dist.formats`).

Example::

    check_xgboost(body, "member 3")     # raises UnsafeModelError naming member 3 and the fault
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from .checks import UnsafeModelError, check_nodes

_FIXED = {"i": ">i1", "U": ">u1", "I": ">i2", "l": ">i4", "L": ">i8", "d": ">f4", "D": ">f8"}
_MAX_DEPTH = 64


class _Unverified(ValueError):
    """A structure this module cannot validate: accepted only from a signed store."""


class _UBJSON:
    """A bounded UBJSON reader (the subset XGBoost writes): lengths are checked against the bytes
    left before anything is allocated; typed arrays become numpy arrays."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = memoryview(data), 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _marker(self) -> str:
        return chr(self._take(1)[0])

    def _int(self, marker: str) -> int:
        if marker not in "iUIlL":
            raise ValueError(f"a length of type {marker!r}")
        return int(np.frombuffer(self._take(np.dtype(_FIXED[marker]).itemsize), _FIXED[marker])[0])

    def _str(self) -> str:
        return bytes(self._take(self._int(self._marker()))).decode("utf-8")

    def value(self, marker: str, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("nested too deep")
        if marker in _FIXED:
            dt = np.dtype(_FIXED[marker])
            return np.frombuffer(self._take(dt.itemsize), dt)[0].item()
        if marker == "S" or marker == "H":
            return self._str()
        if marker == "C":
            return chr(self._take(1)[0])
        if marker in "TFZ":
            return {"T": True, "F": False, "Z": None}[marker]
        if marker == "[":
            return self._array(depth)
        if marker == "{":
            return self._object(depth)
        raise ValueError(f"unknown marker {marker!r}")

    def _array(self, depth: int) -> Any:
        marker = self._marker()
        if marker == "$":
            kind = self._marker()
            if self._marker() != "#":
                raise ValueError("a typed array without a count")
            n = self._int(self._marker())
            if kind not in _FIXED:
                return [self.value(kind, depth + 1) for _ in range(self._bounded(n))]
            dt = np.dtype(_FIXED[kind])
            return np.frombuffer(self._take(n * dt.itemsize), dt).astype(dt.newbyteorder("="))
        if marker == "#":
            return [
                self.value(self._marker(), depth + 1) for _ in range(self._bounded(self._int(self._marker())))
            ]
        out = []
        while marker != "]":
            out.append(self.value(marker, depth + 1))
            marker = self._marker()
        return out

    def _bounded(self, n: int) -> int:
        if n < 0 or n > len(self.data) - self.pos:  # every element takes at least one byte
            raise ValueError("a count larger than the file")
        return n

    def _object(self, depth: int) -> dict:
        out = {}
        while True:
            if self.data[self.pos : self.pos + 1] == b"}":
                self.pos += 1
                return out
            key = self._str()
            out[key] = self.value(self._marker(), depth + 1)


def parse(body: bytes) -> dict:
    """The model document of an XGBoost file (UBJSON, or JSON when it starts with ``{"``)."""
    if body[:2] == b'{"':
        return json.loads(bytes(body).decode("utf-8"))
    reader = _UBJSON(body)
    if reader._marker() != "{":
        raise ValueError("not a UBJSON object")
    doc = reader._object(0)
    if reader.pos != len(body):
        raise ValueError("bytes after the model")
    return doc


def _ints(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.number)):
        raise ValueError(f"{name} is not a list of numbers")
    if arr.size and not np.all(np.isfinite(arr)) or (arr.size and np.any(arr != np.round(arr))):
        raise ValueError(f"{name} holds values that are not integers")
    return arr.astype(np.int64)


def _num(value: Any, name: str) -> int:
    try:
        text = str(value).strip("[]")
        number = float(text)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None
    if number != int(number) or number < 0 or number > 2**31:
        raise ValueError(f"{name}={value!r} is out of range")
    return int(number)


_PER_NODE = ("right_children", "parents", "split_indices", "split_conditions", "default_left", "split_type")


def _check_tree(tree: dict, num_feature: int) -> None:
    left = _ints(tree["left_children"], "left_children")
    n = len(left)
    param = tree.get("tree_param", {})
    if _num(param.get("num_nodes"), "num_nodes") != n:
        raise ValueError(f"num_nodes={param.get('num_nodes')} but {n} nodes")
    if _num(param.get("size_leaf_vector", 1), "size_leaf_vector") > 1:
        raise _Unverified("it is a multi-output tree, which is not validated")
    if _num(param.get("num_feature"), "num_feature") > num_feature:
        raise ValueError(f"num_feature exceeds the model's {num_feature}")
    for name in _PER_NODE + ("base_weights",):
        if len(np.asarray(tree.get(name, []))) != n:
            raise ValueError(f"{name} does not have one value per node ({n})")
    right = _ints(tree["right_children"], "right_children")
    fault = check_nodes(left, right, leaf_marker=-1)
    if fault:
        raise ValueError(fault)
    inner = left != -1
    parents = _ints(tree["parents"], "parents")
    idx = np.arange(n)
    if np.any(parents[left[inner]] != idx[inner]) or np.any(parents[right[inner]] != idx[inner]):
        raise ValueError("parents do not match the children")
    split = _ints(tree["split_indices"], "split_indices")[inner]
    if np.any((split < 0) | (split >= num_feature)):
        raise ValueError(f"splits on features outside [0, {num_feature})")
    _check_categories(tree, n, inner)


def _check_categories(tree: dict, n: int, inner: np.ndarray) -> None:
    kind = _ints(tree["split_type"], "split_type")
    nodes = _ints(tree.get("categories_nodes", []), "categories_nodes")
    segments = _ints(tree.get("categories_segments", []), "categories_segments")
    sizes = _ints(tree.get("categories_sizes", []), "categories_sizes")
    cats = _ints(tree.get("categories", []), "categories")
    if not (len(nodes) == len(segments) == len(sizes)):
        raise ValueError("categories_nodes, _segments and _sizes differ in length")
    if np.any((kind != 0) & (kind != 1)):
        raise ValueError("split_type holds values other than 0 and 1")
    categorical = set(np.flatnonzero((kind == 1) & inner).tolist())
    if np.any((nodes < 0) | (nodes >= n)) or set(nodes.tolist()) != categorical:
        raise ValueError("categories_nodes do not name exactly the categorical splits")
    if np.any((segments < 0) | (sizes < 0) | (segments + sizes > len(cats))):
        raise ValueError("category segments lie outside categories")
    if np.any((cats < 0) | (cats >= 1 << 24)):
        raise ValueError("categories hold values outside [0, 2^24)")


def _check_gbtree(model: dict, num_feature: int, outputs: int) -> int:
    trees = model.get("trees")
    if not isinstance(trees, list):
        raise ValueError("the booster has no list of trees")
    param = model.get("gbtree_model_param", {})
    if _num(param.get("num_trees"), "num_trees") != len(trees):
        raise ValueError(f"num_trees={param.get('num_trees')} but {len(trees)} trees")
    if _num(param.get("num_parallel_tree", 1), "num_parallel_tree") < 1:
        raise ValueError("num_parallel_tree < 1")
    info = _ints(model.get("tree_info", []), "tree_info")
    if len(info) != len(trees) or np.any((info < 0) | (info >= outputs)):
        raise ValueError(f"tree_info does not give each tree an output group below {outputs}")
    indptr = _ints(model.get("iteration_indptr", [0, len(trees)]), "iteration_indptr")
    if len(indptr) < 1 or indptr[0] != 0 or indptr[-1] != len(trees) or np.any(np.diff(indptr) < 0):
        raise ValueError("iteration_indptr does not split the trees into iterations")
    cats = model.get("cats", {})
    if isinstance(cats, dict) and any(len(v) for v in cats.values() if hasattr(v, "__len__")):
        raise _Unverified("it carries a categorical re-coder, which is not validated")
    for i, tree in enumerate(trees):
        try:
            _check_tree(tree, num_feature)
        except _Unverified:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"tree {i}: {exc}") from None
    return len(trees)


def check_xgboost(body: bytes, what: str = "model file", signed: bool = False) -> None:
    """Refuse (:class:`UnsafeModelError`) ``body`` unless every structure XGBoost's predictor
    walks is in range (see the module docstring); ``signed``: the bytes come from a store whose
    signature verified, so what cannot be validated is accepted."""
    try:
        doc = parse(body)
        learner = doc["learner"]
        param = learner["learner_model_param"]
        num_feature = _num(param["num_feature"], "num_feature")
        outputs = max(
            _num(param.get("num_class", 0), "num_class"), _num(param.get("num_target", 1), "num_target"), 1
        )
        booster = learner["gradient_booster"]
        name = booster.get("name")
        if name == "gbtree":
            _check_gbtree(booster["model"], num_feature, outputs)
        elif name == "dart":
            n = _check_gbtree(booster["gbtree"]["model"], num_feature, outputs)
            if len(np.asarray(booster.get("weight_drop", []))) != n:
                raise ValueError("weight_drop does not have one weight per tree")
        elif name == "gblinear":
            weights = np.asarray(booster["model"]["weights"])
            if weights.ndim != 1 or len(weights) != (num_feature + 1) * outputs:
                raise ValueError("the linear weights are not (num_feature + 1) x outputs")
        else:
            raise ValueError(f"unknown booster {name!r}")
    except _Unverified as exc:
        if not signed:
            raise UnsafeModelError(
                f"{what}: {exc}; such XGBoost models load only from a signed store "
                "(ModelStore(key=...), write().signed_with(key))"
            ) from None
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, struct.error) as exc:
        raise UnsafeModelError(
            f"{what}: the XGBoost model was refused before XGBoost read it ({exc}): a crafted or "
            "corrupt file. Nothing was predicted with it."
        ) from None
