"""Independent models per group of rows, as pyspark.ml stages.  [driver]

See :class:`BaggingClassifier` and :class:`BaggingRegressor` (bagging ensembles) and
:class:`GroupedTrainer` (one model per key of a column).
"""

from .estimator import BaggingClassifier, BaggingRegressor
from .grouped import GroupedModel, GroupedTrainer
from .member_records import Member
from .models import BaggingClassificationModel, BaggingRegressionModel

__all__ = [
    "BaggingClassifier",
    "BaggingClassificationModel",
    "BaggingRegressor",
    "BaggingRegressionModel",
    "Member",
    "GroupedTrainer",
    "GroupedModel",
]
