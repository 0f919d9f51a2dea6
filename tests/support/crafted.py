"""Crafted model files: genuine models whose node arrays an attacker edited so that predict would
read or write out of bounds (each case segfaults or corrupts the heap without the checks), and
the mutation fuzzer that runs in a child process (``python -m tests.support.crafted KIND N SEED``).
"""

import json
import sys

import numpy as np


def data(n=300, width=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, width))
    return X, (X[:, 0] + X[:, 1] > 0).astype(int)


def _edit_tree(tree, **fields):
    """Set node fields of a sklearn ``Tree`` (``{field: {index: value}}``), or ``max_depth``."""
    state = tree.__getstate__()
    nodes = state["nodes"].copy()
    for name, changes in fields.items():
        if name == "max_depth":
            state["max_depth"] = changes
            continue
        for i, v in changes.items():
            nodes[name][i] = v
    state["nodes"] = nodes
    tree.__setstate__(state)


def _empty_tree(tree):
    state = tree.__getstate__()
    state.update(nodes=state["nodes"][:0], values=state["values"][:0], node_count=0, max_depth=0)
    tree.__setstate__(state)


def sklearn_cases():
    """{case: crafted fitted estimator}: every sklearn fault the model checks name."""
    from sklearn.ensemble import GradientBoostingClassifier, HistGradientBoostingClassifier
    from sklearn.tree import DecisionTreeClassifier

    X, y = data()
    cases = {}

    def tree():
        return DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y)

    t = tree()
    _edit_tree(t.tree_, left_child={0: 10**6})
    cases["tree child out of range"] = t
    t = tree()
    inner = int(np.flatnonzero(t.tree_.children_left > 0)[-1])
    _edit_tree(t.tree_, left_child={inner: 0})
    cases["tree cycle back to the root"] = t
    t = tree()
    _edit_tree(t.tree_, max_depth=1)
    cases["tree deeper than max_depth"] = t
    t = tree()
    del t.n_features_in_
    cases["tree estimator without n_features_in_"] = t
    t = tree()
    _empty_tree(t.tree_)
    cases["empty tree"] = t
    t = tree()
    _edit_tree(t.tree_, feature={0: 9})
    cases["tree feature past n_features_in_"] = t
    gb = GradientBoostingClassifier(n_estimators=3, random_state=0).fit(X, y)
    gb.estimators_ = np.concatenate([gb.estimators_, gb.estimators_], axis=1)
    cases["gradient boosting estimators_ wider than n_trees_per_iteration_"] = gb
    hgb = HistGradientBoostingClassifier(max_iter=3, random_state=0).fit(X, y)
    nodes = hgb._predictors[0][0].nodes
    nodes["feature_idx"][0] = -5
    cases["hist gradient boosting negative feature_idx"] = hgb
    hgb = HistGradientBoostingClassifier(max_iter=3, random_state=0).fit(X, y)
    hgb._predictors[0][0].nodes = hgb._predictors[0][0].nodes[:0]
    cases["hist gradient boosting empty predictor"] = hgb
    hgb = HistGradientBoostingClassifier(max_iter=3, random_state=0).fit(X, y)
    pred = hgb._predictors[0][0]
    pred.nodes["is_categorical"][0], pred.nodes["bitset_idx"][0] = 1, 0
    pred.raw_left_cat_bitsets = pred.binned_left_cat_bitsets = np.zeros((1, 8), np.uint32)
    cases["hist gradient boosting categorical split on a numeric feature"] = hgb
    svc = _svc(X, y)
    svc.support_ = np.concatenate([svc.support_] * 3).astype(np.int32)  # segfaulted in predict
    cases["svc support_ longer than its support vectors"] = svc
    svc = _svc(X, y)
    svc._dual_coef_ = svc._dual_coef_[:, :2].copy()  # read past it: decision values ~1e231
    cases["svc _dual_coef_ too small"] = svc
    svc = _svc(X, y)
    svc._n_support = (svc._n_support * 4).astype(np.int32)
    cases["svc _n_support past its support vectors"] = svc
    return cases


def _svc(X, y):
    import warnings

    from sklearn.svm import SVC

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SVC(random_state=0).fit(X, y)


def xgboost_model():
    from xgboost import XGBClassifier

    X, y = data()
    return XGBClassifier(n_estimators=3, max_depth=3, random_state=0).fit(X, y)


def xgboost_doc(model):
    raw = model.get_booster().save_raw("json")
    return json.loads(bytes(raw).decode())


def xgboost_file(doc):
    """The package's XGBoost format (header line + model) around a model document."""
    return json.dumps({"class": "XGBClassifier"}).encode() + b"\n" + json.dumps(doc).encode()


def xgboost_cases():
    """{case: (format, bytes)}: each segfaults XGBoost's predict when loaded unchecked."""
    out = {}
    for case, (field, value) in {
        "xgboost split index out of range": ("split_indices", 10**6),
        "xgboost child out of range": ("left_children", 10**6),
        "xgboost cycle": ("left_children", 0),
        "xgboost tree_info past the outputs": ("tree_info", 1000),
    }.items():
        doc = xgboost_doc(xgboost_model())
        model = doc["learner"]["gradient_booster"]["model"]
        if field == "tree_info":
            model["tree_info"][0] = value
        else:
            model["trees"][0][field][0] = value
        out[case] = ("xgboost", xgboost_file(doc))
    return out


def all_cases():
    """{case: (format, bytes)} of every crafted model, as they would lie in a store."""
    import skops.io as sio

    out = {case: ("skops", sio.dumps(est)) for case, est in sklearn_cases().items()}
    out.update(xgboost_cases())
    return out


# --------------------------------------------------------------------------- the fuzzer
_BOUNDARY = (-(2**31), -(2**15), -2, -1, 0, 1, 2, 3, 2**15, 2**31 - 1)


def _value(rng, n):
    if rng.random() < 0.5:
        return int(rng.choice(_BOUNDARY + (n - 1, n, n + 1)))
    return int(rng.integers(-n, 2 * n + 2))


def _mutate_struct(rng, arr, fields):
    """Change one to three entries of a structured node array, in place."""
    for _ in range(rng.integers(1, 4)):
        field = fields[rng.integers(len(fields))]
        info = np.iinfo(arr[field].dtype) if np.issubdtype(arr[field].dtype, np.integer) else None
        v = _value(rng, len(arr))
        if info is not None:
            v = int(np.clip(v, info.min, info.max))
        arr[field][rng.integers(len(arr))] = v


_FITTED = {}


def _fitted(key, make, X, y):
    """A deep copy of a model fitted once per key (fitting is what would make the fuzzer slow)."""
    import copy

    if key not in _FITTED:
        _FITTED[key] = make().fit(X, y)
    return copy.deepcopy(_FITTED[key])


def _fuzz_tree(rng, X, y):
    from sklearn.tree import DecisionTreeClassifier

    depth = int(rng.integers(1, 7))
    t = _fitted(("tree", depth), lambda: DecisionTreeClassifier(max_depth=depth, random_state=0), X, y)
    state = t.tree_.__getstate__()
    nodes = state["nodes"].copy()
    roll = rng.random()
    if roll < 0.8:
        _mutate_struct(rng, nodes, ("left_child", "right_child", "feature"))
    elif roll < 0.9:
        state["max_depth"] = _value(rng, 8) % 64
    else:
        del t.n_features_in_
    state["nodes"] = nodes
    t.tree_.__setstate__(state)
    return t


def _fuzz_gb(rng, X, y):
    from sklearn.ensemble import GradientBoostingClassifier

    gb = _fitted("gb", lambda: GradientBoostingClassifier(n_estimators=3, max_depth=3, random_state=0), X, y)
    roll = rng.random()
    if roll < 0.7:
        tree = gb.estimators_[rng.integers(3), 0].tree_
        state = tree.__getstate__()
        nodes = state["nodes"].copy()
        _mutate_struct(rng, nodes, ("left_child", "right_child", "feature"))
        state["nodes"] = nodes
        tree.__setstate__(state)
    elif roll < 0.85:
        gb.estimators_ = np.concatenate([gb.estimators_] * int(rng.integers(2, 4)), axis=1)
    else:
        gb.n_trees_per_iteration_ = int(rng.choice([0, 2, 3]))
    return gb


def _fuzz_hgb(rng, X, y):
    from sklearn.ensemble import HistGradientBoostingClassifier

    hgb = _fitted(
        "hgb", lambda: HistGradientBoostingClassifier(max_iter=3, max_depth=4, random_state=0), X, y
    )
    pred = hgb._predictors[rng.integers(3)][0]
    roll = rng.random()
    if roll < 0.85:
        fields = ("left", "right", "feature_idx", "is_leaf", "is_categorical", "bitset_idx")
        _mutate_struct(rng, pred.nodes, fields)
    elif roll < 0.93:
        pred.raw_left_cat_bitsets = np.zeros((int(rng.integers(0, 3)), int(rng.integers(0, 9))), np.uint32)
    else:
        hgb.n_trees_per_iteration_ = int(rng.choice([0, 2]))
    return hgb


_SVC_ARRAYS = ("support_", "_n_support", "_dual_coef_", "_intercept_", "_probA", "_probB", "support_vectors_")


def _fuzz_svc(rng, X, y):
    """An SVC (a classifier of 3 classes) whose libsvm arrays are cut, stretched or overwritten."""
    svc = _fitted("svc", lambda: _svc(X, y + (X[:, 2] > 0.8)), X, y + (X[:, 2] > 0.8))
    for _ in range(rng.integers(1, 3)):
        name = _SVC_ARRAYS[rng.integers(len(_SVC_ARRAYS))]
        value = np.array(getattr(svc, name))
        roll = rng.random()
        if roll < 0.4 and value.size:  # overwrite an element
            flat = value.reshape(-1)
            flat[rng.integers(flat.size)] = _value(rng, max(1, value.shape[-1]))
        elif roll < 0.7:  # cut or stretch along its last axis
            n = max(0, value.shape[-1] + int(rng.choice([-3, -1, 1, 3, 40])))
            value = np.resize(value, value.shape[:-1] + (n,))
        else:  # cut or stretch along its first axis
            n = max(0, value.shape[0] + int(rng.choice([-2, -1, 1, 5])))
            value = np.resize(value, (n,) + value.shape[1:])
        setattr(svc, name, np.ascontiguousarray(value))
    return svc


def state_models(X, y):
    """A genuine fitted model of every class the estimator_state format writes."""
    import warnings

    from sparkml_dist.formats import estimator_state

    out = []
    Xp = np.abs(X) + 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls in estimator_state.estimator_classes().values():
            for target in (y, Xp[:, 0], None):
                try:
                    out.append(cls().fit(Xp) if target is None else cls().fit(Xp, target))
                    break
                except Exception:  # noqa: BLE001 - a classifier given a continuous target, ...
                    continue
    return out


def _fuzz_state(rng, blobs):
    """A genuine estimator_state file whose header (its class, an array's shape, dtype or place, a
    value) or array bytes were changed, lengths kept consistent so that most still load."""
    import struct

    from sparkml_dist.formats import estimator_state

    data = blobs[rng.integers(len(blobs))]
    size = struct.unpack("<I", data[8:12])[0]
    header, body = json.loads(data[12 : 12 + size]), bytearray(data[12 + size :])
    arrays = header["arrays"]
    for _ in range(rng.integers(1, 3)):
        roll = rng.random()
        if roll < 0.15:
            names = list(estimator_state.estimator_classes())
            header["class"] = names[rng.integers(len(names))]
        elif roll < 0.55 and arrays:  # reshape an array, its bytes kept (the count may then differ)
            name = list(arrays)[rng.integers(len(arrays))]
            dtype, shape = arrays[name][0], list(arrays[name][1])
            shape = shape or [1]
            shape[rng.integers(len(shape))] = int(abs(_value(rng, 8)) % 12)
            if rng.random() < 0.3:
                shape = shape + [int(rng.integers(0, 3))]
            count = int(np.prod(shape)) if shape else 1
            arrays[name] = [dtype, shape, len(body), count * np.dtype(dtype).itemsize]
            body += bytes(count * np.dtype(dtype).itemsize)
        elif roll < 0.7 and arrays:  # another dtype of the same size
            name = list(arrays)[rng.integers(len(arrays))]
            itemsize = np.dtype(arrays[name][0]).itemsize
            arrays[name][0] = {8: rng.choice(["<i8", "<u8", "<f8"]), 4: rng.choice(["<i4", "<f4"])}.get(
                itemsize, arrays[name][0]
            )
        elif roll < 0.85 and header["values"]:  # a plain value changed
            name = list(header["values"])[rng.integers(len(header["values"]))]
            header["values"][name] = [0, -1, 2**31, 1e308, None, "x", [1, 2]][rng.integers(7)]
        elif len(body):  # array bytes overwritten (NaN, huge, negative)
            at = int(rng.integers(len(body)))
            body[at : at + 8] = np.array([rng.choice([np.nan, 1e308, -1, 2**62])]).tobytes()[: len(body) - at]
    text = json.dumps(header).encode()
    return estimator_state.MAGIC + struct.pack("<I", len(text)) + text + bytes(body)


_XGB_ARRAYS = ("left_children", "right_children", "parents", "split_indices", "split_type", "tree_info")


def _fuzz_xgboost(rng, body):
    """Overwrite elements of the UBJSON typed arrays named in _XGB_ARRAYS, in place (a copy)."""
    import struct

    data = bytearray(body)
    for _ in range(rng.integers(1, 4)):
        key = _XGB_ARRAYS[rng.integers(len(_XGB_ARRAYS))].encode()
        starts = []
        pat = b"L" + struct.pack(">q", len(key)) + key + b"[$"
        at = data.find(pat)
        while at >= 0:
            starts.append(at + len(pat))
            at = data.find(pat, at + 1)
        if not starts:
            continue
        pos = starts[rng.integers(len(starts))]
        kind = chr(data[pos])
        count = struct.unpack(">q", bytes(data[pos + 3 : pos + 11]))[0]
        fmt = {"i": ">b", "U": ">B", "I": ">h", "l": ">i", "L": ">q"}.get(kind)
        if fmt is None or count == 0:
            continue
        size = struct.calcsize(fmt)
        at = pos + 11 + size * int(rng.integers(count))
        lo, hi = (0, 255) if fmt == ">B" else (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1)
        struct.pack_into(fmt, data, at, int(np.clip(_value(rng, count), lo, hi)))
    return bytes(data)


def fuzz(kind, n, seed):
    """Mutate genuine models ``n`` times; each is refused by the checks or predicts.  Returns the
    counts; a crash ends the process (the parent test sees the signal)."""
    import skops.io as sio

    from sparkml_dist import formats as model_formats
    from sparkml_dist.formats.checks import UnsafeModelError, check_sklearn

    rng = np.random.default_rng(seed)
    X, y = data(200, 5)
    counts = {"refused": 0, "predicted": 0}
    if kind == "xgboost":
        header = json.dumps({"class": "XGBClassifier"}).encode() + b"\n"
        body = bytes(xgboost_model().get_booster().save_raw("ubj"))
    if kind == "state":
        Xs = np.abs(X) + 0.1
        blobs = [model_formats.encode(m)[1] for m in state_models(X, y)]
    make = {"tree": _fuzz_tree, "gb": _fuzz_gb, "hgb": _fuzz_hgb, "svc": _fuzz_svc}.get(kind)
    through_file = max(1, n // 20)  # every 20th sklearn mutation also goes through skops
    for i in range(n):
        sys.stdout.write(f"{i}\n")  # the parent names the last case when this process crashes
        sys.stdout.flush()
        try:
            if kind == "xgboost":
                model = model_formats.decode("xgboost", header + _fuzz_xgboost(rng, body))
            elif kind == "state":
                model = model_formats.decode("estimator_state", _fuzz_state(rng, blobs))
            else:
                model = make(rng, X, y)
                if i % through_file == 0:
                    model = model_formats.decode("skops", sio.dumps(model))
                else:
                    check_sklearn(model)
        except UnsafeModelError:
            counts["refused"] += 1
            continue
        except ValueError:  # the library's own refusal (XGBoostError is one): no crash either
            counts["refused by the library"] = counts.get("refused by the library", 0) + 1
            continue
        for method in ("predict_proba", "predict", "decision_function", "transform", "decision_path"):
            if not hasattr(model, method):
                continue
            try:
                getattr(model, method)(Xs if kind == "state" else X)
            except Exception:  # noqa: BLE001 - a Python-level error is fine: never a crash
                pass
        counts["predicted"] += 1
    return counts


if __name__ == "__main__":
    kind, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(fuzz(kind, n, seed)))
