"""Independent models per group of rows, as pyspark.ml stages.  [driver]

See :class:`BaggingClassifier` and :class:`BaggingRegressor` (bagging ensembles) and
:class:`GroupedTrainer` (one model per key of a column); :func:`train_per_group` (your own
training function per group, the models as a table).
"""

from .estimator import BaggingClassifier, BaggingRegressor
from .grouped import GroupedModel, GroupedTrainer
from .member_records import Member
from .models import BaggingClassificationModel, BaggingRegressionModel
from .per_group import GroupMember, GroupModels, train_per_group

__all__ = [
    "BaggingClassifier",
    "BaggingClassificationModel",
    "BaggingRegressor",
    "BaggingRegressionModel",
    "Member",
    "GroupedTrainer",
    "GroupedModel",
    "train_per_group",
    "GroupModels",
    "GroupMember",
]
