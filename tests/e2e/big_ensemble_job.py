"""Started by test_ensemble_e2e: a session whose spark.driver.maxResultSize (1 MiB) is smaller than
the fitted members together, as a big ensemble meets a real driver.  Collected, the fit is refused
with a pointer to membersDir; with membersDir the executors write the members and the fit, transform
and save succeed.  Prints RESULT {...}."""

import json
import sys

import numpy as np
import pandas as pd
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist.ensemble import BaggingClassificationModel, BaggingClassifier
from sparkml_dist.errors import CollectionError
from sparkml_dist.session import get_session

out_dir = sys.argv[1]
spark = get_session(
    "local[2]", conf={"spark.driver.maxResultSize": "1m", "spark.sql.shuffle.partitions": "4"}
)
spark.sparkContext.setLogLevel("ERROR")
rng = np.random.default_rng(0)
X = rng.normal(size=(40_000, 8))
y = rng.integers(0, 2, size=40_000).astype(float)  # noise: unpruned trees grow large
df = spark.createDataFrame(pd.DataFrame({"features": list(X), "label": y}))  # through Arrow
params = dict(estimator=DecisionTreeClassifier(), numModels=4, seed=1)
result = {}
try:
    BaggingClassifier(**params).fit(df)
    result["collected"] = "fitted"
except CollectionError as exc:
    result["collected"] = str(exc)
model = BaggingClassifier(membersDir=f"{out_dir}/members", **params).fit(df)
result["sizes"] = model.groupSizes
result["transform_rows"] = model.transform(df).where("prediction = label").count()
model.write().overwrite().save(f"{out_dir}/model")
loaded = BaggingClassificationModel.read().lazy().load(f"{out_dir}/model")
result["same"] = bool(np.array_equal(loaded.predict_proba(X[:500]), model.predict_proba(X[:500])))
print("RESULT " + json.dumps(result), flush=True)
spark.stop()
