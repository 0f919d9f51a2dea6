"""Independent models per group of rows, as pyspark.ml stages.  [driver]

See :class:`BaggingClassifier` and :class:`BaggingRegressor` (bagging ensembles, and their
``forest()`` preset), :class:`GlobalForestClassifier` / :class:`GlobalForestRegressor` (one forest
whose trees see every row: XGBoost across the ranks of a barrier job), :class:`GroupedTrainer` (one
model per key of a column); :func:`train_per_group` (your own training function per group, the
models as a table).
"""

from ..lazy_names import lazy_names

# Loaded on first use (PEP 562), so that an executor's Python worker importing one of this
# package's executor modules (``engine.fitting``, ``scoring.members``, ...) does not also import the
# driver's estimators and pyspark.ml: 0.6 s off every cold worker's start.
_HOMES = {
    "BaggingClassifier": "estimator",
    "BaggingRegressor": "estimator",
    "BaggingClassificationModel": "models",
    "BaggingRegressionModel": "models",
    "GlobalForestClassifier": "global_forest",
    "GlobalForestRegressor": "global_forest",
    "Member": "member_records",
    "GroupedTrainer": "grouped",
    "GroupedModel": "grouped_model",
    "train_per_group": "per_group",
    "GroupModels": "group_models",
    "GroupMember": "group_models",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

__all__ = [
    "BaggingClassifier",
    "BaggingClassificationModel",
    "BaggingRegressor",
    "BaggingRegressionModel",
    "GlobalForestClassifier",
    "GlobalForestRegressor",
    "Member",
    "GroupedTrainer",
    "GroupedModel",
    "train_per_group",
    "GroupModels",
    "GroupMember",
]
