"""Every structure a compiled predictor walks, checked before it is used.  [anywhere]

A model file that loads inert (skops builds only trusted types, XGBoost parses its own format) can
still corrupt memory when it *predicts*: scikit-learn's tree predictors and XGBoost's C++ walk node
arrays without bounds checks.  :func:`check_sklearn` walks a loaded object and refuses, naming
what is wrong, any

* decision tree (``sklearn.tree._tree.Tree``) that is empty, whose children are out of range or
  do not form a tree (every node but the root has exactly one parent, children come after their
  parent, so no cycle), whose real depth differs from ``max_depth`` (``decision_path`` sizes its
  buffer by it), or whose split features fall outside ``[0, n_features_in_)``;
* estimator holding trees without ``n_features_in_`` (its predict would not check the input
  width), or whose trees claim more inputs than the ensemble that calls them unchecked
  (forests, gradient boosting, isolation forests);
* ``GradientBoosting*`` whose ``estimators_`` is not ``(n_iter, n_trees_per_iteration_)`` or whose
  initial predictions are not ``n_trees_per_iteration_`` wide;
* ``HistGradientBoosting*`` predictor that is empty, has children, features, bitset indices or
  bitset widths out of range, categorical splits on features the bin mapper does not call
  categorical, or a preprocessor whose output width is not the model's input width;
* support vector machine whose arrays would make libsvm read out of bounds
  (:mod:`.svm_checks`).

XGBoost models are checked before XGBoost sees them (:mod:`sparkml_dist.formats.xgboost_checks`).

Example::

    model = skops.io.loads(data, trusted=...)
    check_sklearn(model, "member 3")        # raises UnsafeModelError naming member 3 and the fault
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..errors import CollectionError


class UnsafeModelError(CollectionError):
    """A model file would need code (or unreviewed types) to load, or holds a structure that would
    corrupt memory when used, and the caller did not opt in."""


def refuse(what: str, where: str, why: str) -> None:
    raise UnsafeModelError(
        f"{what}: {where} {why}; it was refused before use (a crafted or corrupt model file). "
        "Nothing was predicted with it."
    )


# --------------------------------------------------------------------------- node arrays
def check_nodes(left: np.ndarray, right: np.ndarray, leaf_marker: Optional[int] = None, is_leaf=None) -> str:
    """'' when ``left``/``right`` (child indices) form one tree rooted at node 0 whose children come
    after their parent; else what is wrong.  Leaves are where ``is_leaf`` (or both children equal
    ``leaf_marker``)."""
    n = len(left)
    if n == 0:
        return "has no nodes"
    if len(right) != n:
        return "has child arrays of different lengths"
    left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
    if is_leaf is None:
        leaf = (left == leaf_marker) & (right == leaf_marker)
        if np.any((left == leaf_marker) != (right == leaf_marker)):
            return "has a node with one child"
    else:
        leaf = np.asarray(is_leaf).astype(bool)
    idx = np.arange(n)
    inner = ~leaf
    kids = np.concatenate([left[inner], right[inner]])
    if np.any(kids <= np.concatenate([idx[inner], idx[inner]])) or np.any(kids >= n):
        return "has children out of range (or before their parent: a cycle)"
    parents = np.bincount(kids, minlength=n)
    if parents[0] != 0 or np.any(parents[1:] != 1):
        return "has nodes with no parent or several (not a tree)"
    return ""


def tree_depth(left: np.ndarray, right: np.ndarray, leaf: np.ndarray) -> int:
    """The depth of the deepest leaf of a tree that passed :func:`check_nodes`."""
    frontier, depth = np.array([0]), 0
    while True:
        inner = frontier[~leaf[frontier]]
        if inner.size == 0:
            return depth
        frontier, depth = np.concatenate([left[inner], right[inner]]), depth + 1


# --------------------------------------------------------------------------- scikit-learn
def _n_features(est: Any, what: str, where: str) -> int:
    n = getattr(est, "n_features_in_", None)
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        refuse(what, where, f"has no valid n_features_in_ ({n!r}), so its input width is unchecked")
    return int(n)


def _check_tree(tree: Any, width: int, what: str, where: str) -> None:
    from sklearn.tree._tree import TREE_LEAF

    left, right = np.asarray(tree.children_left), np.asarray(tree.children_right)
    fault = check_nodes(left, right, leaf_marker=TREE_LEAF)
    if fault:
        refuse(what, where, fault)
    if tree.value.shape[0] != tree.node_count or len(left) != tree.node_count:
        refuse(what, where, "has arrays whose lengths differ from node_count")
    leaf = left == TREE_LEAF
    real = tree_depth(left.astype(np.int64), right.astype(np.int64), leaf)
    if real != tree.max_depth:
        refuse(what, where, f"is {real} deep but says max_depth={tree.max_depth}")
    feature = np.asarray(tree.feature)[~leaf]
    bound = min(int(tree.n_features), width)
    if np.any((feature < 0) | (feature >= bound)):
        refuse(what, where, f"splits on features outside [0, {bound})")


def _check_predictor(pred: Any, width: int, categorical: Optional[np.ndarray], what: str, where: str) -> None:
    nodes = pred.nodes
    if not isinstance(nodes, np.ndarray) or nodes.dtype.names is None or nodes.ndim != 1:
        refuse(what, where, "has a node array of the wrong type")
    leaf = nodes["is_leaf"].astype(bool)
    fault = check_nodes(nodes["left"], nodes["right"], is_leaf=leaf)
    if fault:
        refuse(what, where, fault)
    feature = nodes["feature_idx"][~leaf].astype(np.int64)
    if np.any((feature < 0) | (feature >= width)):
        refuse(what, where, f"splits on features outside [0, {width})")
    for name in ("raw_left_cat_bitsets", "binned_left_cat_bitsets"):
        bits = getattr(pred, name, None)
        if not isinstance(bits, np.ndarray) or bits.ndim != 2 or bits.shape[1] != 8:
            refuse(what, where, f"has {name} that are not (n, 8) bitsets")
    cat = nodes["is_categorical"].astype(bool) & ~leaf
    if cat.any():
        if np.any(nodes["bitset_idx"][cat] >= len(pred.raw_left_cat_bitsets)):
            refuse(what, where, "has categorical splits pointing past its bitsets")
        if categorical is None or not np.all(categorical[nodes["feature_idx"][cat]]):
            refuse(what, where, "splits categorically on a feature its bin mapper does not call categorical")


def _check_hist_gb(est: Any, what: str, where: str) -> None:
    width = _n_features(est, what, where)
    k = getattr(est, "n_trees_per_iteration_", None)
    predictors = getattr(est, "_predictors", None)
    if not isinstance(predictors, list) or not all(isinstance(p, list) and len(p) == k for p in predictors):
        refuse(what, where, f"has predictors that are not lists of n_trees_per_iteration_={k}")
    mapper = getattr(est, "_bin_mapper", None)
    categorical = getattr(mapper, "is_categorical_", None)
    if categorical is not None:
        categorical = np.asarray(categorical).astype(bool)
        if categorical.shape != (width,):
            refuse(what, where, f"has a bin mapper for {categorical.size} features, not {width}")
    pre = getattr(est, "_preprocessor", None)
    if pre is not None and _column_transformer_width(pre) != width:
        refuse(what, where, f"has a preprocessor whose output is not {width} columns wide")
    for i, row in enumerate(predictors):
        for j, pred in enumerate(row):
            _check_predictor(pred, width, categorical, what, f"{where}._predictors[{i}][{j}]")


def _column_transformer_width(pre: Any) -> int:
    """The output width of a fitted ColumnTransformer whose columns are masks or index lists; -1
    for anything else (refused)."""
    from sklearn.compose import ColumnTransformer

    if not isinstance(pre, ColumnTransformer):
        return -1
    width = 0
    for _, trans, cols in getattr(pre, "transformers_", []):
        cols = np.asarray(cols)
        if cols.dtype == bool:
            n = int(cols.sum())
        elif cols.ndim == 1 and np.issubdtype(cols.dtype, np.integer):
            n = len(cols)
        else:
            return -1
        width += 0 if isinstance(trans, str) and trans == "drop" else n
    return width


def _check_gradient_boosting(est: Any, what: str, where: str) -> None:
    width = _n_features(est, what, where)
    k = getattr(est, "n_trees_per_iteration_", None)
    trees = getattr(est, "estimators_", None)
    n_iter = getattr(est, "n_estimators_", None)
    if not isinstance(trees, np.ndarray) or trees.ndim != 2 or trees.shape != (n_iter, k):
        shape = getattr(trees, "shape", None)
        refuse(what, where, f"has estimators_ of shape {shape}, not (n_estimators_, n_trees_per_iteration_)")
    try:  # the trees were checked already: only the initial estimator runs here, on one zero row
        init = est._raw_predict_init(np.zeros((1, width)))
    except Exception as exc:  # noqa: BLE001 - whatever it raises, the model cannot predict
        refuse(what, where, f"cannot make its initial prediction ({type(exc).__name__}: {exc})")
    if init.shape != (1, k):
        refuse(what, where, f"starts from predictions {init.shape[1]} wide, not n_trees_per_iteration_={k}")


def _unchecked_callers():
    """Estimators that call their trees without checking the input width again."""
    from sklearn.ensemble import IsolationForest
    from sklearn.ensemble._forest import BaseForest
    from sklearn.ensemble._gb import BaseGradientBoosting

    return (BaseForest, BaseGradientBoosting, IsolationForest)


def check_sklearn(obj: Any, what: str = "model file") -> None:
    """Refuse (:class:`UnsafeModelError`) ``obj`` if any tree structure reachable from it could
    make a compiled predictor read or write out of bounds (see the module docstring)."""
    from sklearn.base import BaseEstimator
    from sklearn.ensemble._hist_gradient_boosting.gradient_boosting import BaseHistGradientBoosting
    from sklearn.ensemble._hist_gradient_boosting.predictor import TreePredictor
    from sklearn.svm._base import BaseLibSVM
    from sklearn.tree import BaseDecisionTree
    from sklearn.tree._tree import Tree

    from .svm_checks import libsvm_fault

    unchecked = _unchecked_callers()
    seen: set = set()
    stack = [(obj, None, type(obj).__name__)]
    while stack:
        node, bound, where = stack.pop()
        if id(node) in seen or isinstance(node, (str, bytes, int, float, type(None))):
            continue
        seen.add(id(node))
        if isinstance(node, (Tree, TreePredictor)):
            refuse(what, where, "is a tree outside the estimator that checks its input")
        if isinstance(node, BaseEstimator):  # unfitted ones (no tree_, ...) hold no trees yet
            if isinstance(node, BaseDecisionTree) and hasattr(node, "tree_"):
                width = _n_features(node, what, where)
                if bound is not None and width > bound:
                    refuse(what, where, f"claims {width} inputs inside a model of {bound}")
                if not isinstance(node.tree_, Tree):
                    refuse(what, where, "has a tree_ that is not a tree")
                _check_tree(node.tree_, min(width, bound or width), what, f"{where}.tree_")
                seen.add(id(node.tree_))
            elif isinstance(node, BaseHistGradientBoosting) and hasattr(node, "_predictors"):
                _check_hist_gb(node, what, where)
                seen.update(id(p) for row in node._predictors for p in row)
            elif isinstance(node, BaseLibSVM) and hasattr(node, "support_"):
                fault = libsvm_fault(node, _n_features(node, what, where))
                if fault:
                    refuse(what, where, fault)
            fitted = isinstance(node, unchecked) and hasattr(node, "estimators_")
            bound = _n_features(node, what, where) if fitted else None
        stack.extend((child, bound, f"{where}{label}") for label, child in _children(node))
    for node_est in _gradient_boosters(obj):
        _check_gradient_boosting(node_est, what, type(node_est).__name__)


def _children(node: Any):
    if isinstance(node, np.ndarray):
        if node.dtype != object:
            return []
        return [(f"[{i}]", v) for i, v in enumerate(node.ravel())]
    if isinstance(node, dict):
        return [(f"[{k!r}]", v) for k, v in node.items()]
    if isinstance(node, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(node)]
    return [(f".{k}", v) for k, v in getattr(node, "__dict__", {}).items()]


def _gradient_boosters(obj: Any):
    """Every GradientBoosting* estimator reachable from ``obj`` (checked once all trees were)."""
    from sklearn.ensemble._gb import BaseGradientBoosting

    seen, stack, found = set(), [obj], []
    while stack:
        node = stack.pop()
        if id(node) in seen or isinstance(node, (str, bytes, int, float, type(None))):
            continue
        seen.add(id(node))
        if isinstance(node, BaseGradientBoosting) and hasattr(node, "estimators_"):
            found.append(node)
        stack.extend(child for _, child in _children(node))
    return found
