"""Independent models per group of rows: bagging ensembles as pyspark.ml stages.  [driver]

See :class:`BaggingClassifier` and :class:`BaggingRegressor`.
"""

from .aggregation import Member
from .estimator import (BaggingClassificationModel, BaggingClassifier, BaggingRegressionModel,
                        BaggingRegressor)

__all__ = ["BaggingClassifier", "BaggingClassificationModel", "BaggingRegressor",
           "BaggingRegressionModel", "Member"]
