"""The random-forest preset of the bagging estimators, in MLlib's parameter names.  [driver]

``BaggingClassifier.forest(...)`` / ``BaggingRegressor.forest(...)`` build a bagging estimator whose
members are scikit-learn decision trees that sample features at every split, each tree fitted on
its own disjoint share of the rows (``numTrees`` groups, one tree per task). On this project's
benchmark (300k x 50 rows, 16 trees of depth 10, local[2]) that is the fastest configuration that
loses no AUC against MLlib's ``RandomForestClassifier``: see the ensemble frontier in docs/benchmarks.md.

A user switching from MLlib keeps the parameter names::

    from sparkml_dist.ensemble import BaggingClassifier

    # was: RandomForestClassifier(numTrees=16, maxDepth=10, seed=7)
    forest = BaggingClassifier.forest(numTrees=16, maxDepth=10, seed=7, featuresCol="features")
    model = forest.fit(train_df)        # a BaggingClassificationModel: transform, save, load

``featureSubsetStrategy`` takes MLlib's values ("auto", "all", "sqrt", "log2", "onethird", or a
fraction such as "0.3"); "auto" is 0.3 for a classifier (measured best on the benchmark; MLlib's
"auto" is sqrt) and "onethird" for a regressor, as MLlib. Any other bagging parameter
(``featuresCols``, ``labelCol``, ``weightCol``, ``membersDir``, ``sampleRatio``, ...) passes through.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

from .. import arg_checks
from ..errors import ConfigurationError

_STRATEGIES = {"all": 1.0, "sqrt": "sqrt", "log2": "log2", "onethird": 1.0 / 3.0}
_SET_BY_THE_PRESET = ("estimator", "numModels", "sampling")


def max_features(strategy: str, is_classifier: bool) -> Union[str, float]:
    """scikit-learn's ``max_features`` for MLlib's ``featureSubsetStrategy``."""
    if not isinstance(strategy, str):
        raise ConfigurationError(
            f"featureSubsetStrategy must be a string (MLlib's values: 'auto', 'all', 'sqrt', 'log2', "
            f"'onethird', or a fraction such as '0.3'), got {strategy!r}"
        )
    s = strategy.strip().lower()
    if s == "auto":
        return 0.3 if is_classifier else 1.0 / 3.0
    if s in _STRATEGIES:
        return _STRATEGIES[s]
    try:
        share = float(s)
    except ValueError:
        share = float("nan")
    if not 0.0 < share <= 1.0:
        raise ConfigurationError(
            f"featureSubsetStrategy={strategy!r} is not one of 'auto', 'all', 'sqrt', 'log2', 'onethird' "
            "nor a fraction in (0, 1] such as '0.3'."
        )
    return share


def preset(
    cls,
    *,
    numTrees: int = 16,
    maxDepth: Optional[int] = 10,
    featureSubsetStrategy: str = "auto",
    minInstancesPerNode: int = 1,
    seed: int = 42,
    **params: Any,
):
    """``cls`` (BaggingClassifier or BaggingRegressor) set up as a random forest; checked here,
    before any Spark job. ``maxDepth=None`` grows each tree until its leaves are pure.
    (``strategy="global"`` builds :func:`.global_forest.preset` instead.)"""
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    taken = [p for p in _SET_BY_THE_PRESET if p in params]
    if taken:
        raise ConfigurationError(
            f"forest() sets {', '.join(taken)} itself (one decision tree per disjoint share of the "
            f"rows); pass numTrees/maxDepth/featureSubsetStrategy, or build {cls.__name__}(...) directly."
        )
    num = arg_checks.integer("numTrees", numTrees, 1)
    depth = arg_checks.integer("maxDepth", maxDepth, 1, none_ok=True)
    leaf = arg_checks.integer("minInstancesPerNode", minInstancesPerNode, 1)
    is_classifier = cls._is_classifier
    tree = (DecisionTreeClassifier if is_classifier else DecisionTreeRegressor)(
        max_depth=depth,
        max_features=max_features(featureSubsetStrategy, is_classifier),
        min_samples_leaf=leaf,
    )
    return cls(estimator=tree, numModels=num, sampling="disjoint", seed=seed, **params)


def xgb_params(p: dict, n_features: int, classes, seed: int) -> dict:
    """XGBoost's random-forest mode for the global forest's checked parameters ``p`` (trees,
    depth, share, rate, bins): one round of ``num_parallel_tree`` trees, ``learning_rate=1``."""
    share = p["share"]
    if share == "sqrt":
        share = max(1, int(math.sqrt(n_features))) / n_features
    elif share == "log2":
        share = max(1, int(math.log2(n_features))) / n_features
    params = {
        "tree_method": "hist",
        "num_parallel_tree": p["trees"],
        "max_depth": p["depth"],
        "learning_rate": 1.0,
        "subsample": p["rate"],
        "colsample_bynode": float(share),
        "max_bin": p["bins"],
        "seed": int(seed),
    }
    if classes is None:
        params["objective"] = "reg:squarederror"
    elif len(classes) == 2:
        params["objective"] = "binary:logistic"
    else:
        params.update(objective="multi:softprob", num_class=len(classes))
    return params


def check_rank_memory(features, n_rows: int, workers: int, width: int, budget: int) -> None:
    """The global forest's XGBoost gets each rank's rows dense: refuse, before the barrier job,
    what a task cannot hold (``budget`` bytes: the float32 matrix + the float64 rows it is built
    from)."""
    rows = -(-n_rows // workers)
    need = rows * (width * 12.0 + 16)
    if need > budget:
        fewer = -(-int(need) // budget) * workers
        raise ConfigurationError(
            f"features {features!r}: each of numWorkers={workers} ranks would hold {rows} rows x {width} "
            f"features dense (XGBoost's matrix here), about {need / 2**30:.1f} GiB, more than one task "
            f"can hold ({budget / 2**30:.1f} GiB). Raise numWorkers (to about {fewer}), make the features "
            "narrower (e.g. HashingTF's numFeatures), or use BaggingClassifier, whose members keep "
            "sparse vectors sparse."
        )
