"""Independent models per group of rows, as pyspark.ml stages.  [driver]

See :class:`BaggingClassifier` and :class:`BaggingRegressor` (bagging ensembles, and their
``forest()`` preset), :class:`GlobalForestClassifier` / :class:`GlobalForestRegressor` (one forest
whose trees see every row: XGBoost across the ranks of a barrier job), :class:`GroupedTrainer` (one
model per key of a column); :func:`train_per_group` (your own training function per group, the
models as a table).
"""

from .estimator import BaggingClassifier, BaggingRegressor
from .global_forest import GlobalForestClassifier, GlobalForestRegressor
from .grouped import GroupedModel, GroupedTrainer
from .member_records import Member
from .models import BaggingClassificationModel, BaggingRegressionModel
from .per_group import GroupMember, GroupModels, train_per_group

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
